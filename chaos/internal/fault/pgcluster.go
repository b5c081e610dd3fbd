package fault

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
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
	return c.run(ctx, "pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "-o", strings.Join(opts, " "), "start")
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
	kids := children(pid)
	_ = syscall.Kill(pid, syscall.SIGSTOP) // no new child while we kill
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil && len(children(pid)) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
