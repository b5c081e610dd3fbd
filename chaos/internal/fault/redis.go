package fault

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file starts redis-server processes without a testing.TB, so the
// chaos runner can use them too (internal/redisproc is built around
// testing.TB and fails the test instead of returning errors).

// redisStartTimeout bounds how long a server may take to answer PING.
const redisStartTimeout = 15 * time.Second

// RedisBinary returns the redis-server to run: $REDIS_SERVER when set, else
// redis-server on $PATH. It returns [ErrNoRedisServer] when there is none.
func RedisBinary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoRedisServer, err)
	}
	return p, nil
}

// RedisOptions configure a [RedisServer].
type RedisOptions struct {
	// Args are extra redis-server arguments, for example
	// {"--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"}.
	Args []string
	// ReplicaOf makes the server a replica of "host:port" at start.
	ReplicaOf string
}

// RedisServer is one redis-server process of the suite on a loopback port,
// without persistence: a restart comes back empty, the way a crashed cache
// node does.
type RedisServer struct {
	bin  string
	dir  string
	port int
	opts RedisOptions

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	paused   bool
	restarts atomic.Int64
}

// StartRedis starts a server on a free loopback port and waits until it
// answers PING. Close it when done. Errors match [ErrNoRedisServer] or
// [ErrRedisProcess].
func StartRedis(opts RedisOptions) (*RedisServer, error) {
	bin, err := RedisBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "chaos-redis-")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRedisProcess, err)
	}
	s := &RedisServer{bin: bin, dir: dir, opts: opts}
	for attempt := 0; attempt < 5; attempt++ {
		if s.port, err = freePort(); err != nil {
			break
		}
		if err = s.start(); err == nil {
			return s, nil
		}
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("%w: start: %w", ErrRedisProcess, err)
}

// Addr returns "127.0.0.1:port"; it stays the same across restarts.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Restarts returns how many times the server was restarted.
func (s *RedisServer) Restarts() int64 { return s.restarts.Load() }

// Client returns a new client for the server with no retries, for the
// suite's own administrative commands.
func (s *RedisServer) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
}

// Kill stops the server with SIGKILL: its data is gone and connections are
// refused until [RedisServer.Restart].
func (s *RedisServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Restart kills the server if it runs and starts it again, empty, on the
// same port, as a primary (a [RedisOptions.ReplicaOf] given at start is
// dropped: use [RedisServer.ReplicaOf] after the restart).
func (s *RedisServer) Restart() error {
	s.mu.Lock()
	s.killLocked()
	s.opts.ReplicaOf = ""
	s.mu.Unlock()
	if err := s.start(); err != nil {
		return fmt.Errorf("%w: restart %s: %w", ErrRedisProcess, s.Addr(), err)
	}
	s.restarts.Add(1)
	return nil
}

// Pause stops the process with SIGSTOP: the kernel still accepts
// connections but nothing is answered. [RedisServer.Resume] continues it.
func (s *RedisServer) Pause() error { return s.signal(syscall.SIGSTOP, true) }

// Resume continues a paused server with SIGCONT.
func (s *RedisServer) Resume() error { return s.signal(syscall.SIGCONT, false) }

// ReplicaOf makes the server a replica of addr (it drops its own data and
// loads the primary's) or, with addr "", a primary (REPLICAOF NO ONE).
func (s *RedisServer) ReplicaOf(ctx context.Context, addr string) error {
	c := s.Client()
	defer c.Close()
	var err error
	if addr == "" {
		err = c.Do(ctx, "REPLICAOF", "NO", "ONE").Err()
	} else {
		host, port, serr := net.SplitHostPort(addr)
		if serr != nil {
			return fmt.Errorf("%w: replicaof %q: %w", ErrRedisProcess, addr, serr)
		}
		err = c.Do(ctx, "REPLICAOF", host, port).Err()
	}
	if err != nil {
		return fmt.Errorf("%w: replicaof on %s: %w", ErrRedisProcess, s.Addr(), err)
	}
	return nil
}

// Close kills the server and removes its directory.
func (s *RedisServer) Close() {
	s.mu.Lock()
	if s.cmd != nil && s.paused {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
	s.killLocked()
	s.mu.Unlock()
	os.RemoveAll(s.dir)
}

func (s *RedisServer) signal(sig syscall.Signal, paused bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("%w: %s is not running", ErrRedisProcess, s.Addr())
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%w: signal %v to %s: %w", ErrRedisProcess, sig, s.Addr(), err)
	}
	s.paused = paused
	return nil
}

func (s *RedisServer) killLocked() {
	if s.cmd == nil {
		return
	}
	if s.paused {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done, s.paused = nil, nil, false
}

var errAddrInUse = errors.New("address already in use")

func (s *RedisServer) args() []string {
	a := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--repl-diskless-sync-delay", "0",
	}
	if s.opts.ReplicaOf != "" {
		if host, port, err := net.SplitHostPort(s.opts.ReplicaOf); err == nil {
			a = append(a, "--replicaof", host, port)
		}
	}
	return append(a, s.opts.Args...)
}

func (s *RedisServer) start() error {
	logPath := filepath.Join(s.dir, "redis.log")
	var offset int64
	if fi, err := os.Stat(logPath); err == nil {
		offset = fi.Size()
	}
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = sysProcAttr()
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(redisStartTimeout)
	for ping(s.Addr()) != nil {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			if int64(len(b)) >= offset {
				b = b[offset:]
			}
			if strings.Contains(string(b), "Address already in use") {
				return errAddrInUse
			}
			return fmt.Errorf("redis-server exited: %s%s", stderr.String(), b)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("no PONG from %s within %v", s.Addr(), redisStartTimeout)
		}
	}
	s.mu.Lock()
	s.cmd, s.done, s.paused = cmd, done, false
	s.mu.Unlock()
	return nil
}

// ping sends PING on a raw connection and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING: %q", strings.TrimSpace(line))
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitFor polls cond every 20ms until it returns nil or timeout passes.
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
