package fastpath_test

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// tcpFront is a listener in front of a Redis server: with a target it
// forwards each connection, delaying every chunk of the server's replies;
// without one it is a black hole that accepts connections, reads
// everything and never answers.
type tcpFront struct {
	ln     net.Listener
	target string
	delay  time.Duration
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func newTCPFront(t *testing.T, target string, delay time.Duration) *tcpFront {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &tcpFront{ln: ln, target: target, delay: delay}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *tcpFront) addr() string { return f.ln.Addr().String() }

func (f *tcpFront) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		return false
	}
	f.conns = append(f.conns, c)
	return true
}

func (f *tcpFront) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			return
		}
		if f.target == "" {
			f.wg.Go(func() { _, _ = io.Copy(io.Discard, c) }) // read everything, answer nothing
			continue
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		if !f.track(s) {
			return
		}
		f.wg.Go(func() {
			_, _ = io.Copy(s, c)
			s.Close()
		})
		f.wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					time.Sleep(f.delay) // a slow Redis: each reply takes delay
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

func (f *tcpFront) close() {
	f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// atOnce runs call(0) to call(n-1), each on its own goroutine, released
// together, and waits for all of them.
func atOnce(t *testing.T, n int, call func(i int)) {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			call(i)
		})
	}
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute): // a liveness bound, not a speed target
		t.Fatal("callers still waiting after a minute: the wait for a connection is unbounded")
	}
}

// burst sends n Claims at once through s and returns their errors.
func burst(t *testing.T, s *fastpath.Scripts, n int) []error {
	t.Helper()
	errs := make([]error, n)
	atOnce(t, n, func(i int) {
		_, errs[i] = s.Claim(context.Background(), refFor(t, "k"+uuid.NewString()),
			fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
	})
	return errs
}

// opensCounter counts the breaker's openings.
type opensCounter struct{ n atomic.Int64 }

func (o *opensCounter) record(s fastpath.BreakerState) {
	if s == fastpath.BreakerOpen {
		o.n.Add(1)
	}
}

// poolScripts is a Scripts on a go-redis client of addr with a pool of
// poolSize connections.
func poolScripts(t *testing.T, addr string, poolSize int, ctxTimeouts bool, timeout time.Duration) (*fastpath.Scripts, *opensCounter) {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		PoolSize:              poolSize,
		ContextTimeoutEnabled: ctxTimeouts,
		// Bounds how long a detached call's goroutine outlives its wrapper
		// when the client ignores context deadlines.
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
		DialTimeout:  time.Second,
		// Far above any wait here: a call that runs out of it has a bug,
		// not a loaded machine.
		PoolTimeout: 50 * time.Second,
	})
	t.Cleanup(func() { c.Close() })
	opens := &opensCounter{}
	s, err := fastpath.New(c, fastpath.Options{
		Prefix:        "poolwait",
		Timeout:       timeout,
		Breaker:       fastpath.BreakerOptions{Failures: 3, CoolDown: time.Minute},
		OnStateChange: opens.record,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, opens
}

// TestPoolWait_SaturatedPoolKeepsBreakerClosed: a pool of one connection to
// a Redis that takes 20ms a reply, and 60 calls at once with a per-call
// timeout of 300ms. Each call takes a fraction of its timeout once it has
// the connection, but the last ones queue for it for over a second. The
// breaker must stay closed and every call must succeed.
//
// The negative control runs the same burst with the wait for the
// connection counted in the timeout, as before the pool gate
// (fastpath.CountPoolWait): calls that queue past 300ms fail, and three of
// them in a row open the breaker, which the test's assertions would catch.
func TestPoolWait_SaturatedPoolKeepsBreakerClosed(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{})
	const (
		callers = 60
		delay   = 20 * time.Millisecond
		timeout = 300 * time.Millisecond
	)
	for _, mode := range []struct {
		name        string
		ctxTimeouts bool
	}{{"ContextTimeoutClient", true}, {"DefaultClient", false}} {
		t.Run(mode.name, func(t *testing.T) {
			front := newTCPFront(t, srv.Addr(), delay)
			s, opens := poolScripts(t, front.addr(), 1, mode.ctxTimeouts, timeout)
			for i, err := range burst(t, s, callers) {
				if err != nil {
					t.Fatalf("call %d: %v, want success: queueing for the connection is not Redis failing", i, err)
				}
			}
			if n := opens.n.Load(); n != 0 || s.Breaker() != fastpath.BreakerClosed {
				t.Fatalf("breaker opened %d times (now %v), want never", n, s.Breaker())
			}
		})
		t.Run(mode.name+"/NegativeControl_PoolWaitCounted", func(t *testing.T) {
			front := newTCPFront(t, srv.Addr(), delay)
			s, opens := poolScripts(t, front.addr(), 1, mode.ctxTimeouts, timeout)
			fastpath.CountPoolWait(s)
			errs := burst(t, s, callers)
			failed := len(slices.DeleteFunc(slices.Clone(errs), func(err error) bool { return err == nil }))
			if opens.n.Load() == 0 || failed == 0 {
				t.Fatalf("with the pool wait counted: %d calls failed, breaker opened %d times; "+
					"want both, or this burst does not test the pool wait", failed, opens.n.Load())
			}
		})
	}
}

// TestPoolWait_UnresponsiveRedisStillOpensBreaker: the same burst on a
// pool of two connections to a listener that never answers. The calls that
// have a connection time out after the per-call timeout and open the
// breaker; the calls still waiting for a connection then return
// ErrBreakerOpen without being sent, so no caller hangs behind a dead Redis.
//
// Control: the only difference from the test above is that this Redis does
// not answer (there, a slow but answering Redis with the pool just as
// saturated kept the breaker closed), so the opening here is the timeouts of
// calls that were sent, not the queueing. A gate that ignored Redis's own
// timeouts, or that let the queued calls through after the breaker opened,
// fails the ErrBreakerOpen and "sent" checks below.
func TestPoolWait_UnresponsiveRedisStillOpensBreaker(t *testing.T) {
	t.Parallel()
	const (
		callers = 60
		pool    = 2
		timeout = 100 * time.Millisecond
	)
	for _, mode := range []struct {
		name        string
		ctxTimeouts bool
	}{{"ContextTimeoutClient", true}, {"DefaultClient", false}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			hole := newTCPFront(t, "", 0)
			s, opens := poolScripts(t, hole.addr(), pool, mode.ctxTimeouts, timeout)
			var open, sent int
			for i, err := range burst(t, s, callers) {
				switch {
				case errors.Is(err, fastpath.ErrBreakerOpen):
					open++
				case errors.Is(err, fastpath.ErrUnavailable):
					sent++
				default:
					t.Fatalf("call %d: %v, want ErrUnavailable", i, err)
				}
			}
			// A timeout seen while this process lags (a loaded CI machine)
			// fails its call but is not counted by the breaker (see
			// Scripts.run), and its send goes to a call still queued:
			// each such call lets one more through.
			lagged := fastpath.LaggedCalls(s)
			if sent-lagged < 3 {
				t.Fatalf("%d of the %d timeouts came while this process lagged: fewer than three counted, so this burst tested nothing", lagged, sent)
			}
			if counted := sent - lagged; opens.n.Load() == 0 || s.Breaker() != fastpath.BreakerOpen {
				t.Fatalf("breaker opened %d times (now %v) after %d counted timeouts on a Redis that never answers, want open",
					opens.n.Load(), s.Breaker(), counted)
			}
			if lagged > 0 {
				t.Logf("%d of the %d timeouts came while this process lagged, not counted by the breaker", lagged, sent)
			}
			// Three failures open it: the first two waves of two, and at
			// most a wave more racing the opening.
			if sent > 3*pool+lagged {
				t.Fatalf("%d calls timed out (%d while this process lagged) and %d returned ErrBreakerOpen; want at most %d+%d timed out, the rest turned away once the breaker opened",
					sent, lagged, open, 3*pool, lagged)
			}
		})
	}
}
