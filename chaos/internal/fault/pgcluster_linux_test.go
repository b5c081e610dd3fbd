package fault

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestSysvKey(t *testing.T) {
	pidfile := "4242\n/tmp/d\n1700000000\n5432\n/tmp\n127.0.0.1\n   745552         4\nready   \n"
	if got, want := sysvKey([]byte(pidfile)), "/SYSV000b6050"; got != want {
		t.Fatalf("sysvKey = %q, want %q", got, want)
	}
	for _, bad := range []string{"4242\n", "1\n2\n3\n4\n5\n6\n\n", "1\n2\n3\n4\n5\n6\n        0         0\n"} {
		if got := sysvKey([]byte(bad)); got != "" {
			t.Errorf("sysvKey(%q) = %q, want none", bad, got)
		}
	}
}

// TestCluster_CrashLeavesNothingAttached crashes a cluster while clients
// keep opening sessions (so the postmaster is forking backends when it is
// killed) and checks that no process is left on its shared memory and that
// it starts again, three times.
func TestCluster_CrashLeavesNothingAttached(t *testing.T) {
	if testing.Short() && !testenv.CI() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := NewCluster(ctx, "max_connections=50")
	if errors.Is(err, ErrNoPostgres) && !testenv.CI() {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for round := 0; round < 3; round++ {
		b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
		if err != nil {
			t.Fatal(err)
		}
		key := sysvKey(b)
		if key == "" {
			t.Fatalf("no shared memory key in postmaster.pid:\n%s", b)
		}
		// The detector itself: the live postmaster maps the segment.
		if len(attached(key)) == 0 {
			t.Fatalf("round %d: attached(%s) finds no process on a running cluster", round, key)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					cctx, ccancel := context.WithTimeout(ctx, time.Second)
					if conn, err := pgx.Connect(cctx, c.URL()); err == nil {
						_, _ = conn.Exec(cctx, "select 1")
						_ = conn.Close(cctx)
					}
					ccancel()
				}
			}()
		}
		time.Sleep(300 * time.Millisecond)
		err = c.Crash()
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if left := attached(key); len(left) != 0 {
			t.Fatalf("round %d: processes %v still attached after Crash", round, left)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatalf("round %d: restart: %v", round, err)
		}
	}
}

// TestCluster_CrashKillsWhatStillHoldsTheSharedMemory is the failure the
// listing of children alone missed: a process that is not (or no longer) a
// child of the postmaster keeps the segment attached, and the restart is
// refused with "pre-existing shared memory block is still in use". Here an
// outside process attaches it; Crash must find it by its mapping.
func TestCluster_CrashKillsWhatStillHoldsTheSharedMemory(t *testing.T) {
	if testing.Short() && !testenv.CI() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := NewCluster(ctx)
	if errors.Is(err, ErrNoPostgres) && !testenv.CI() {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(strings.Split(string(b), "\n")[6])
	holder := exec.Command(os.Args[0], "-test.run=^TestShmHolder$")
	holder.Env = append(os.Environ(), "FAULT_SHM_HOLD="+f[1])
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	done := make(chan error, 1)
	go func() { done <- holder.Wait() }()
	ready := make([]byte, 6)
	if _, err := out.Read(ready); err != nil || string(ready) != "ready\n" {
		t.Fatalf("holder did not attach: %q %v", ready, err)
	}
	if err := c.Crash(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Crash left the outside holder of the shared memory running")
	}
	if err := c.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
}

// TestShmHolder is run as a subprocess by the test above: it attaches the
// System V segment FAULT_SHM_HOLD and sleeps.
func TestShmHolder(t *testing.T) {
	id, err := strconv.Atoi(os.Getenv("FAULT_SHM_HOLD"))
	if err != nil {
		t.Skip("a helper process, run by TestCluster_CrashKillsWhatStillHoldsTheSharedMemory")
	}
	if _, _, errno := syscall.Syscall(syscall.SYS_SHMAT, uintptr(id), 0, 0); errno != 0 {
		t.Fatalf("shmat %d: %v", id, errno)
	}
	os.Stdout.WriteString("ready\n")
	time.Sleep(time.Minute)
}

// TestCluster_FailoverFailbackRejoin fails a synchronous pair over and
// back twice: each time the standby is cut off, the primary SIGKILLed,
// the standby promoted, the old primary rejoined as a standby of the new
// one (Rejoin) and the new primary made synchronous again
// (SetSynchronous). Every row committed before a failover must be on the
// promoted node, and the rejoined node must be in recovery.
func TestCluster_FailoverFailbackRejoin(t *testing.T) {
	if testing.Short() && !testenv.CI() {
		t.Skip("starts PostgreSQL clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a, err := NewCluster(ctx, "wal_level=replica", "max_connections=50")
	if errors.Is(err, ErrNoPostgres) && !testenv.CI() {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := a.Standby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.SetSynchronous(ctx, true); err != nil {
		t.Fatal(err)
	}
	exec := func(c *Cluster, q string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	count := func(c *Cluster) (n int, recovery bool) {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM rows), pg_is_in_recovery()").Scan(&n, &recovery); err != nil {
			t.Fatal(err)
		}
		return n, recovery
	}
	exec(a, "CREATE TABLE rows (i int)")
	primary, standby := a, b
	for round := 1; round <= 4; round++ {
		exec(primary, "INSERT INTO rows VALUES (1)")
		if err := standby.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
		if err := primary.Crash(); err != nil {
			t.Fatal(err)
		}
		if err := standby.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		if err := primary.Rejoin(ctx, standby); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		primary, standby = standby, primary
		if err := primary.SetSynchronous(ctx, true); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if n, rec := count(primary); n != round || rec {
			t.Fatalf("round %d: the promoted node has %d rows (recovery %v), want %d, not in recovery", round, n, rec, round)
		}
		if _, rec := count(standby); !rec {
			t.Fatalf("round %d: the rejoined node is not in recovery", round)
		}
	}
}

// TestCluster_CanceledSyncWaitCommitsLocally pins the PostgreSQL behavior
// the nemesis ran into (chaos/README.md, Repeated faults and the
// nemesis): with a synchronous standby gone, a COMMIT waits; when its
// client's context expires, pgx closes the connection and sends a
// CancelRequest, and the server stops waiting: the transaction is
// committed locally and visible to every other session, though no
// standby has it. A read that finds it (a retry's replay, a re-read
// after a lost reply) acknowledges what a failover then loses.
func TestCluster_CanceledSyncWaitCommitsLocally(t *testing.T) {
	if testing.Short() && !testenv.CI() {
		t.Skip("starts PostgreSQL clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := NewCluster(ctx, "synchronous_commit=on", "wal_level=replica", "synchronous_standby_names=*")
	if errors.Is(err, ErrNoPostgres) && !testenv.CI() {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := a.Standby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	conn, err := pgx.Connect(ctx, a.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE rows (i int)"); err != nil {
		t.Fatal(err)
	}
	if err := b.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	ictx, icancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = conn.Exec(ictx, "INSERT INTO rows VALUES (1)")
	icancel()
	if err == nil {
		t.Fatal("the INSERT committed without its synchronous standby")
	}
	other, err := pgx.Connect(ctx, a.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	var n int
	// The cancel is asynchronous: the row shows once the server took it.
	for deadline := time.Now().Add(10 * time.Second); n == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err := other.QueryRow(ctx, "SELECT count(*) FROM rows").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	if n != 1 {
		t.Fatalf("%d rows visible after the canceled wait, want the 1 committed locally", n)
	}
}
