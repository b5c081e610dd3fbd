package redisproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oncekey/oncekey/testkit/loopback"
)

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 15 * time.Second

// ErrNoBinary is returned by [Binary] and [New] when no redis-server binary
// is found ($REDIS_SERVER, else redis-server on $PATH).
var ErrNoBinary = errors.New("redisproc: redis-server not found (install redis-server or set REDIS_SERVER)")

// Options configure one server.
type Options struct {
	// Args are extra redis-server arguments, for example
	// []string{"--maxmemory-policy", "allkeys-lru"}.
	Args []string
	// ReplicaOf, when set, makes the server a replica of that address
	// ("127.0.0.1:port"), at start and at every restart.
	ReplicaOf string
	// Cluster starts the server with cluster-enabled yes. Use [Cluster] or
	// [StartCluster] to build a working cluster.
	Cluster bool
}

// Server is one redis-server process on a loopback port.
type Server struct {
	bin  string
	dir  string
	port int
	opts Options

	mu     sync.Mutex
	proc   *loopback.Process // nil while not running
	paused bool
}

// TB is the part of testing.TB that [Start], [Pair], [Cluster] and
// [StartCluster] use. The package does not import testing, so a program
// that is not a test (the chaos runner) can use [New].
type TB = loopback.TB

// Binary returns the path of the redis-server binary: $REDIS_SERVER when
// set, else the first redis-server on $PATH. The error matches
// [ErrNoBinary] when there is none.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoBinary, err)
	}
	return p, nil
}

// New starts a server on a free loopback port and waits until it answers
// PING. [Server.Close] stops it and removes its directory. The error
// matches [ErrNoBinary] when redis-server is not installed.
func New(opts Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if opts.ReplicaOf != "" {
		if _, _, err := net.SplitHostPort(opts.ReplicaOf); err != nil {
			return nil, fmt.Errorf("redisproc: ReplicaOf %q: %w", opts.ReplicaOf, err)
		}
	}
	dir, err := os.MkdirTemp("", "redisproc-")
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	s := &Server{bin: bin, dir: dir, opts: opts}
	if err = loopback.OnFreePort(func(port int) error { s.port = port; return s.start() }); err == nil {
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redisproc: start: %w", err)
}

// Start is [New] for a test: the server is closed when the test ends. When
// redis-server is missing the test fails with CI=true (CI must never pass by
// skipping) and is skipped with the reason otherwise; any other error fails
// it.
func Start(t TB, opts Options) *Server {
	t.Helper()
	s, err := New(opts)
	return loopback.ForTest(t, s, err, ErrNoBinary)
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's port. It stays the same across [Server.Restart].
func (s *Server) Port() int { return s.port }

// Kill stops the server with SIGKILL and waits for it to exit. Its data is
// gone; connections to its port are refused until [Server.Restart].
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Crash is [Server.Kill] for callers that take any server, some of which
// can fail to die (a container's): SIGKILL, wait until the process is
// gone. It returns nil.
func (s *Server) Crash() error {
	s.Kill()
	return nil
}

// Restart starts the server again, empty, on the same port and with the
// same [Options] (killing it first if it runs), and waits until it answers
// PING. A cluster node keeps its nodes.conf, so it rejoins its cluster with
// its slots but no keys.
func (s *Server) Restart() error {
	s.mu.Lock()
	s.killLocked()
	s.mu.Unlock()
	if err := s.start(); err != nil {
		return fmt.Errorf("redisproc: restart %s: %w", s.Addr(), err)
	}
	return nil
}

// Pause stops the process with SIGSTOP: connections are accepted by the
// kernel but nothing is answered, like a server stalled by swapping or a
// long fork. [Server.Resume] undoes it; Kill and Close resume a paused
// server first.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP, true) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT, false) }

// Running reports whether the process is running (paused counts as running).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.Exited()
}

// Log returns the server's log so far, for failure messages.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

// Close kills the server and removes its directory.
func (s *Server) Close() {
	s.mu.Lock()
	s.killLocked()
	s.mu.Unlock()
	os.RemoveAll(s.dir)
}

func (s *Server) signal(sig syscall.Signal, paused bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("redisproc: %s is not running", s.Addr())
	}
	if err := s.proc.Signal(sig); err != nil {
		return fmt.Errorf("redisproc: signal %v to %s: %w", sig, s.Addr(), err)
	}
	s.paused = paused
	return nil
}

func (s *Server) killLocked() {
	if s.proc == nil {
		return
	}
	if s.paused {
		_ = s.proc.Signal(syscall.SIGCONT)
	}
	s.proc.Kill()
	s.proc, s.paused = nil, false
}

func (s *Server) args() []string {
	a := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		// A replica attaching to this server is served at once, not after
		// the default 5s wait for more replicas.
		"--repl-diskless-sync-delay", "0",
	}
	if s.opts.Cluster {
		a = append(a, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")
	}
	if s.opts.ReplicaOf != "" {
		host, port, _ := net.SplitHostPort(s.opts.ReplicaOf) // checked by New
		a = append(a, "--replicaof", host, port)
	}
	return append(a, s.opts.Args...)
}

func (s *Server) start() error {
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	proc, err := loopback.StartProcess(cmd, loopback.ProcessOptions{
		Name:    "redis-server",
		Addr:    s.Addr(),
		Log:     filepath.Join(s.dir, "redis.log"),
		Ready:   func(pid int) error { return ping(s.Addr(), pid) },
		Poll:    10 * time.Millisecond,
		Timeout: startTimeout,
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc, s.paused = proc, false
	s.mu.Unlock()
	return nil
}

// ping sends PING and INFO server over a raw connection and expects +PONG
// (a server still loading answers -LOADING) from process pid: another
// process may hold the port when ours failed to bind it.
func ping(addr string, pid int) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\nINFO server\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING: %q", strings.TrimSpace(line))
	}
	head, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil || !strings.HasPrefix(head, "$") {
		return fmt.Errorf("INFO: %q", strings.TrimSpace(head))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	if !strings.Contains(string(body), "\nprocess_id:"+strconv.Itoa(pid)+"\r") {
		return fmt.Errorf("%s is answered by another process than pid %d", addr, pid)
	}
	return nil
}

// waitFor polls cond every 20ms until it returns nil or timeout passes, and
// returns its last error.
func waitFor(ctx context.Context, timeout time.Duration, cond func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := cond(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}
