package sqlite_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/sqlite"
)

const (
	childEnv   = "ONCEKEY_SQLITE_CHILD_DB"
	procs      = 4
	procKeys   = 40
	procTenant = "tenant-proc"
)

func procScope(i int) durable.Scope {
	return durable.Scope{Tenant: procTenant, Operation: "POST /orders", Key: "proc-key-" + strconv.Itoa(i)}
}

// TestHelperProcess is a child of TestSeveralProcessesShareOneFile; it does
// nothing in a normal run.
func TestHelperProcess(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		return
	}
	child, _ := strconv.Atoi(os.Getenv(childEnv + "_N"))
	s, err := sqlite.OpenStore(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Start together: say ready, wait for the parent's go.
	if err := os.WriteFile(fmt.Sprintf("%s.ready.%d", path, child), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !waitFile(path + ".go") {
		t.Fatal("no go from the parent")
	}
	claim := func(sc durable.Scope) bool {
		r, err := s.Claim(t.Context(), nil, storeapi.ClaimParams{
			Scope: sc, Fingerprint: "v1:proc", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour,
		})

		if err != nil {
			t.Fatal(err)
		}
		if r.Acquired {
			if err := s.Complete(t.Context(), nil, r.Ref, r.Token, durable.Result{StatusCode: 201, Body: []byte(strconv.Itoa(child))}); err != nil {
				t.Fatal(err)
			}
		}
		return r.Acquired
	}
	for j := range procKeys {
		// A shared key (each child starts elsewhere), then one of its own.
		if i := (j + child*procKeys/procs) % procKeys; claim(procScope(i)) {
			fmt.Printf("acquired %d\n", i)
		}
		own := procScope(j)
		own.Tenant = fmt.Sprintf("own-%d", child)
		if claim(own) {
			fmt.Println("own")
		}
	}
}

// TestSeveralProcessesShareOneFile runs several processes claiming the same
// keys of one file (on the test machine's file system): each shared key is
// acquired and completed exactly once, and every key a process alone claims
// is acquired (no spurious busy error across processes). Which process wins
// a shared key is up to SQLite's lock, which is not fair between processes.
func TestSeveralProcessesShareOneFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "procs.db")
	parent := openAt(t, path)
	cmds := make([]*exec.Cmd, procs)
	outs := make([]*bytes.Buffer, procs)
	for n := range procs {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+path, fmt.Sprintf("%s_N=%d", childEnv, n))
		outs[n] = new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = outs[n], outs[n]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[n] = cmd
	}
	for n := range procs {
		if !waitFile(fmt.Sprintf("%s.ready.%d", path, n)) {
			t.Fatalf("child %d never got ready:\n%s", n, outs[n])
		}
	}
	if err := os.WriteFile(path+".go", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	acquired := map[int]int{}
	for n, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", n, err, outs[n])
		}
		won, own := 0, 0
		sc := bufio.NewScanner(outs[n])
		for sc.Scan() {
			if k, ok := strings.CutPrefix(sc.Text(), "acquired "); ok {
				i, _ := strconv.Atoi(k)
				acquired[i]++
				won++
			} else if sc.Text() == "own" {
				own++
			}
		}
		t.Logf("process %d acquired %d shared keys", n, won)
		if own != procKeys {
			t.Fatalf("process %d acquired %d of its own %d keys", n, own, procKeys)
		}
	}
	for i := range procKeys {
		if acquired[i] != 1 {
			t.Fatalf("key %d acquired %d times across processes, want 1", i, acquired[i])
		}
		ref, _ := parent.Ref(procScope(i))
		// Completed by the one acquisition: never taken over.
		if rec := mustGet(t, parent, ref); rec.State != durable.Completed || rec.Takeovers != 0 ||
			rec.Token.Generation < uint64(rec.CreatedAt.UnixMilli()-60_000) {
			t.Fatalf("key %d: %+v", i, rec)
		}
	}
}

// waitFile polls for a file, for at most about 30 s.
func waitFile(name string) bool {
	for range 30000 {
		if _, err := os.Stat(name); err == nil {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}
