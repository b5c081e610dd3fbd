package fault

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/testkit/loopback"
)

// ErrNoPostgres is returned by [PostgresBin] when the PostgreSQL server
// binaries (initdb, pg_ctl) cannot be found.
var ErrNoPostgres = errors.New("fault: PostgreSQL server binaries (initdb, pg_ctl) not found; install postgresql or set PG_BIN")

// PostgresBin returns the directory of initdb and pg_ctl: $PG_BIN, else
// the newest /usr/lib/postgresql/*/bin.
func PostgresBin() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
		return "", ErrNoPostgres
	}
	ms, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(ms) == 0 {
		if p, err := exec.LookPath("initdb"); err == nil {
			return filepath.Dir(p), nil
		}
		return "", ErrNoPostgres
	}
	return filepath.Dir(ms[len(ms)-1]), nil
}

// Cluster is a throwaway PostgreSQL cluster on a loopback port, in a
// temporary directory owned by the postgres user when run as root.
type Cluster struct {
	bin, dir string
	port     int
	settings []string
}

// NewCluster runs initdb in a temporary directory and starts the server on
// a free loopback port with settings (name=value, passed as -c).
func NewCluster(ctx context.Context, settings ...string) (*Cluster, error) {
	bin, err := PostgresBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "oncekey-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, dir: dir, settings: settings}
	if os.Geteuid() == 0 {
		if out, err := exec.CommandContext(ctx, "chown", "-R", "postgres:postgres", dir).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("fault: chown %s: %w: %s", dir, err, out)
		}
	}
	if err := c.run(ctx, "initdb", "-D", c.data(), "-A", "trust", "-U", "postgres", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if c.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// URL is a connection string for database postgres as user postgres.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port is the server's port.
func (c *Cluster) Port() int { return c.port }

// Addr is the server's host:port, "127.0.0.1:port".
func (c *Cluster) Addr() string { return "127.0.0.1:" + strconv.Itoa(c.port) }

func (c *Cluster) run(ctx context.Context, tool string, args ...string) error {
	name := filepath.Join(c.bin, tool)
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, name, args...)
	}
	cmd.Dir = c.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("fault: %s: %w: %s", tool, err, out)
	}
	return nil
}

// Start starts the server (again, after [Cluster.Crash]: it recovers from
// its WAL) and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	opts := []string{"-p " + strconv.Itoa(c.port), "-k " + c.dir, "-c listen_addresses=127.0.0.1"}
	for _, s := range c.settings {
		opts = append(opts, "-c "+s)
	}
	err := c.run(ctx, "pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "-o", strings.Join(opts, " "), "start")
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(c.dir, "log")); rerr == nil {
			err = fmt.Errorf("%w\nserver log (end):\n%s", err, b[max(0, len(b)-2000):])
		}
	}
	return err
}

// Crash kills the postmaster and every one of its processes with SIGKILL
// at once, as a power loss kills the server process tree: WAL still in
// shared memory (wal_buffers) is lost; what was written to the OS is not.
func (c *Cluster) Crash() error {
	b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("fault: crash: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return fmt.Errorf("fault: crash: postmaster.pid: %w", err)
	}
	shm := sysvKey(b)
	_ = syscall.Kill(pid, syscall.SIGSTOP) // no new child while we kill
	kids := children(pid)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	// Wait for every process by its pid: once the postmaster is gone its
	// children are re-parented, so "no children of pid" proves nothing,
	// and a restart while one still holds the shared memory is refused.
	// The postmaster must be reaped too, not only dead: a new postmaster
	// refuses to start while the pid in postmaster.pid answers kill(pid, 0),
	// and a zombie does.
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range append(kids, pid) {
		for alive(p) || (p == pid && syscall.Kill(pid, 0) == nil) {
			if time.Now().After(deadline) {
				return fmt.Errorf("fault: crash: process %d still alive after SIGKILL", p)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Whatever the listing missed still has the cluster's System V shared
	// memory attached, and a new postmaster refuses to start beside it
	// ("pre-existing shared memory block is still in use"): find those
	// processes by their mapping and kill them too.
	if shm == "" {
		return nil
	}
	for {
		left := attached(shm)
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fault: crash: processes %v still attached to the shared memory after SIGKILL", left)
		}
		for _, p := range left {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sysvKey returns the name under which the cluster's System V shared memory
// segment appears in /proc/PID/maps ("/SYSV" and its key in 8 hex digits),
// from line 7 of postmaster.pid ("key shmid"), or "" when it has none.
func sysvKey(pidfile []byte) string {
	lines := strings.Split(string(pidfile), "\n")
	if len(lines) < 7 {
		return ""
	}
	f := strings.Fields(lines[6])
	if len(f) == 0 {
		return ""
	}
	key, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil || key == 0 {
		return ""
	}
	return fmt.Sprintf("/SYSV%08x", key)
}

// attached lists the live processes that map the shared memory segment
// named name (see [sysvKey]).
func attached(name string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || !alive(n) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/maps")
		if err != nil {
			continue
		}
		if strings.Contains(string(b), name+" ") || strings.Contains(string(b), name+"\n") {
			out = append(out, n)
		}
	}
	return out
}

// alive reports whether process pid exists and is not a zombie (a zombie
// has released its memory; only its exit status waits to be reaped).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(s[i+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// Close stops the server (immediate) and removes its directory.
func (c *Cluster) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = c.run(ctx, "pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
	os.RemoveAll(c.dir)
}

// freePort is a free loopback port for a server of the suite's own.
func freePort() (int, error) { return loopback.FreePort() }

// Standby takes a base backup of c (pg_basebackup -R: it streams from c)
// into a new temporary directory and starts it on a free loopback port
// with c's settings.
func (c *Cluster) Standby(ctx context.Context) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "oncekey-pg-")
	if err != nil {
		return nil, err
	}
	// Its own settings without synchronous_standby_names: once promoted it
	// has no standby, and would wait for one forever.
	var settings []string
	for _, v := range c.settings {
		if !strings.HasPrefix(v, "synchronous_standby_names=") {
			settings = append(settings, v)
		}
	}
	s := &Cluster{bin: c.bin, dir: dir, settings: settings}
	if os.Geteuid() == 0 {
		if out, err := exec.CommandContext(ctx, "chown", "-R", "postgres:postgres", dir).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("fault: chown %s: %w: %s", dir, err, out)
		}
	}
	src := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=standby", c.port)
	if err := s.run(ctx, "pg_basebackup", "-D", s.data(), "-R", "-X", "stream", "-c", "fast", "-d", src); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if s.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Promote promotes a standby to primary and waits until it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	return c.run(ctx, "pg_ctl", "-D", c.data(), "-w", "-t", "60", "promote")
}

// Disconnect stops a standby's streaming: primary_conninfo is emptied and
// reloaded, so its WAL receiver exits and does not come back. (SIGSTOP is
// not enough: the WAL already in the socket's buffers is still received
// after SIGCONT.)
func (c *Cluster) Disconnect(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("fault: disconnect standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
		return fmt.Errorf("fault: disconnect standby: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("fault: disconnect standby: %w", err)
	}
	for range 100 {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n); err != nil {
			return fmt.Errorf("fault: disconnect standby: %w", err)
		}
		if n == 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("fault: disconnect standby: its WAL receiver is still running")
}

// Freeze stops (SIGSTOP) every process of the server, so that a standby
// receives nothing; Thaw resumes them.
func (c *Cluster) Freeze() error { return c.signalAll(syscall.SIGSTOP) }

// Thaw resumes a server stopped by [Cluster.Freeze].
func (c *Cluster) Thaw() error { return c.signalAll(syscall.SIGCONT) }

func (c *Cluster) signalAll(sig syscall.Signal) error {
	b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("fault: signal: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return fmt.Errorf("fault: signal: postmaster.pid: %w", err)
	}
	for _, k := range children(pid) {
		_ = syscall.Kill(k, sig)
	}
	return syscall.Kill(pid, sig)
}

// Dir is the cluster's temporary directory (owned by postgres when run as
// root).
func (c *Cluster) Dir() string { return c.dir }

// EnableTLS writes a server certificate of ca into the cluster's directory
// and turns ssl on (ALTER SYSTEM, reload). It returns the CA file, for
// sslrootcert.
func (c *Cluster) EnableTLS(ctx context.Context, ca *CA) (string, error) {
	caFile, certFile, keyFile, err := ca.WriteServer(c.dir)
	if err != nil {
		return "", err
	}
	if os.Geteuid() == 0 {
		if out, err := exec.CommandContext(ctx, "chown", "postgres:postgres", caFile, certFile, keyFile).CombinedOutput(); err != nil {
			return "", fmt.Errorf("fault: chown certs: %w: %s", err, out)
		}
	}
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return "", fmt.Errorf("fault: enable tls: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{
		"ALTER SYSTEM SET ssl_cert_file = '" + certFile + "'",
		"ALTER SYSTEM SET ssl_key_file = '" + keyFile + "'",
		"ALTER SYSTEM SET ssl = on",
		"SELECT pg_reload_conf()",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return "", fmt.Errorf("fault: enable tls: %s: %w", q, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the reload is asynchronous
	return caFile, nil
}

// Rejoin makes c, a former primary that was crashed (or stopped), a
// streaming standby of primary, the way an operator rejoins an old
// primary without pg_rewind: its data directory is replaced by a base
// backup of primary (pg_basebackup -R: it streams from primary, named
// "standby"), and it starts again on the same port with its settings but
// synchronous_standby_names (promoted later, it would wait for a standby
// forever; see [Cluster.SetSynchronous]). What only the old primary had
// (commits it wrote and never replicated, which no client was told had
// committed when the standby was synchronous) is discarded.
func (c *Cluster) Rejoin(ctx context.Context, primary *Cluster) error {
	_ = c.run(ctx, "pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop") // already down after a crash
	if err := os.RemoveAll(c.data()); err != nil {
		return fmt.Errorf("fault: rejoin: %w", err)
	}
	var settings []string
	for _, v := range c.settings {
		if !strings.HasPrefix(v, "synchronous_standby_names=") {
			settings = append(settings, v)
		}
	}
	c.settings = settings
	src := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=standby", primary.port)
	if err := c.run(ctx, "pg_basebackup", "-D", c.data(), "-R", "-X", "stream", "-c", "fast", "-d", src); err != nil {
		return fmt.Errorf("fault: rejoin: %w", err)
	}
	return c.Start(ctx)
}

// SetSynchronous makes c, a primary, commit only once a standby has the
// commit's WAL (on: synchronous_standby_names '*' by ALTER SYSTEM), or
// alone (off), and waits until a standby streams from it, and with on
// until that standby is synchronous. It fails for a primary whose
// synchronous_standby_names was set on its command line, which ALTER
// SYSTEM cannot change.
func (c *Cluster) SetSynchronous(ctx context.Context, on bool) error {
	for _, v := range c.settings {
		if strings.HasPrefix(v, "synchronous_standby_names=") {
			return fmt.Errorf("fault: set synchronous: synchronous_standby_names is set on the command line")
		}
	}
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("fault: set synchronous: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := "ALTER SYSTEM RESET synchronous_standby_names"
	if on {
		q = "ALTER SYSTEM SET synchronous_standby_names = '*'"
	}
	for _, s := range []string{q, "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("fault: set synchronous: %s: %w", s, err)
		}
	}
	return waitStandby(ctx, conn, on)
}

// WaitStandby waits until a standby streams from c, a primary, and with
// sync until it is synchronous: after a crash and restart of c, the
// commits it recovered (written, never acknowledged, and visible now)
// reach the standby only once it streams again.
func (c *Cluster) WaitStandby(ctx context.Context, sync bool) error {
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("fault: wait for a standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return waitStandby(ctx, conn, sync)
}

func waitStandby(ctx context.Context, conn *pgx.Conn, on bool) error {
	want := "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
	if on {
		want += " AND sync_state = 'sync'"
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, want).Scan(&n); err != nil {
			return fmt.Errorf("fault: wait for a standby: %w", err)
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("fault: wait for a standby (synchronous %v): none streams after 60s", on)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
