//go:build unix

package loopback

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStartProcess_ReadyExitedAndTimeout: a process that answers is
// returned running and Kill stops it; one that exits saying its port is
// taken (in its log or its output) is ErrAddrInUse, and only for what this
// run added to the log; one that exits otherwise, or never answers, is an
// error with its output, and the latter is killed.
func TestStartProcess_ReadyExitedAndTimeout(t *testing.T) {
	t.Parallel()
	logFile := filepath.Join(t.TempDir(), "server.log")
	opts := func(ready func(int) error) ProcessOptions {
		return ProcessOptions{Name: "server", Addr: "127.0.0.1:1", Log: logFile, Ready: ready, Poll: 5 * time.Millisecond, Timeout: 300 * time.Millisecond}
	}
	never := func(int) error { return errors.New("not yet") }

	var readyPid int
	p, err := StartProcess(exec.Command("sleep", "30"), opts(func(pid int) error { readyPid = pid; return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid() != readyPid || p.Exited() {
		t.Fatalf("pid %d (Ready saw %d), exited %v; want the same pid, running", p.Pid(), readyPid, p.Exited())
	}
	p.Kill()
	if !p.Exited() {
		t.Fatal("not exited after Kill")
	}

	if _, err := StartProcess(exec.Command("sh", "-c", "echo 'bind: Address already in use' >&2; exit 1"), opts(never)); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("taken port in the output: %v, want ErrAddrInUse", err)
	}
	appendLog := "echo 'bind: Address already in use' >>" + logFile + "; exit 1"
	if _, err := StartProcess(exec.Command("sh", "-c", appendLog), opts(never)); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("taken port in the log: %v, want ErrAddrInUse", err)
	}
	_, err = StartProcess(exec.Command("sh", "-c", "echo bad config >&2; exit 3"), opts(never))
	if err == nil || errors.Is(err, ErrAddrInUse) || !strings.Contains(err.Error(), "server exited: bad config") {
		t.Fatalf("an earlier run's taken port in the log: %v, want this run's exit", err)
	}

	pidFile := filepath.Join(t.TempDir(), "pid")
	_, err = StartProcess(exec.Command("sh", "-c", "echo $$ >"+pidFile+"; echo starting; exec sleep 30"), opts(never))
	if err == nil || !strings.Contains(err.Error(), "no answer from 127.0.0.1:1 within 300ms (last: not yet): starting") {
		t.Fatalf("never ready: %v", err)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the process that never answered: signal 0 = %v, want ESRCH (gone)", err)
	}
}
