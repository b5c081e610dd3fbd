//go:build unix

package loopback

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// ProcessOptions say how [StartProcess] knows that a server answers.
type ProcessOptions struct {
	// Name is the program's name, for errors ("redis-server exited: ...").
	Name string
	// Addr is the server's address, for errors.
	Addr string
	// Log is the file the server logs to. It may be appended to across
	// restarts: only what this run adds is searched for a taken port.
	Log string
	// Ready returns nil once the server answers as the process pid
	// (another process may hold the port when ours failed to bind it).
	Ready func(pid int) error
	// Poll is the time between two calls of Ready.
	Poll time.Duration
	// Timeout bounds how long the server may take to answer.
	Timeout time.Duration
}

// Process is a server process started by [StartProcess].
type Process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// StartProcess starts cmd (its output captured, in a process group of its
// own so that a ^C on the test does not reach it first and, on Linux,
// killed if the process that started it dies, unless it drops root to
// another user, which clears that) and calls o.Ready every o.Poll until it
// returns nil. When the process exits first, the error is [ErrAddrInUse]
// if its output or what it added to its log says "Address already in
// use" (see [OnFreePort]), else one with both. After o.Timeout it kills
// the process and returns Ready's last error, the output and the log.
func StartProcess(cmd *exec.Cmd, o ProcessOptions) (*Process, error) {
	var offset int64
	if fi, err := os.Stat(o.Log); err == nil {
		offset = fi.Size()
	}
	cmd.SysProcAttr = sysProcAttr()
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()

	deadline := time.Now().Add(o.Timeout)
	for {
		err := o.Ready(cmd.Process.Pid)
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			log := readLog(o.Log)
			if int64(len(log)) >= offset {
				log = log[offset:]
			}
			if strings.Contains(log, "Address already in use") || strings.Contains(stderr.String(), "Address already in use") {
				return nil, ErrAddrInUse
			}
			return nil, fmt.Errorf("%s exited: %s%s", o.Name, stderr.String(), log)
		case <-time.After(o.Poll):
		}
		if time.Now().After(deadline) {
			p.Kill()
			return nil, fmt.Errorf("no answer from %s within %v (last: %v): %s%s", o.Addr, o.Timeout, err, stderr.String(), readLog(o.Log))
		}
	}
}

// readLog returns the log file's content, "" when it cannot be read.
func readLog(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill stops the process with SIGKILL and waits until it has exited.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
