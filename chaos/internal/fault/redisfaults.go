package fault

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// vanishLease expires the record's key in 1ms when it holds a lease (a
// result is left alone).
var vanishLease = redis.NewScript(`local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) == 'L' then return redis.call('PEXPIRE', KEYS[1], 1) end
return 0`)

// VanishLease makes the Redis lease of ref expire now (PEXPIRE 1 on the
// record's key while it holds a lease): the effect of a Redis clock jump,
// which libfaketime cannot produce on a real redis-server. It reports
// whether there was a lease to expire.
func VanishLease(ctx context.Context, c redis.Scripter, prefix string, ref durable.Ref) (bool, error) {
	n, err := vanishLease.Run(ctx, c, []string{fastpath.KeysFor(prefix, ref).Record}).Int()
	if err != nil {
		return false, fmt.Errorf("%w: pexpire lease: %w", ErrRedisProcess, err)
	}
	return n == 1, nil
}

// ScriptSends counts the Lua scripts a go-redis client runs: [ScriptSends.Hook]
// counts the calls the application made, [ScriptSends.Dialer] the commands
// that went on the wire. go-redis re-sends a command whose reply timed out
// (MaxRetries), so a delayed reply shows as more sends than calls: the
// server may have run the script more than once.
type ScriptSends struct {
	calls atomic.Int64
	sends atomic.Int64
}

// Calls returns how many EVAL/EVALSHA commands the client was asked to run.
func (s *ScriptSends) Calls() int64 { return s.calls.Load() }

// Sends returns how many EVAL/EVALSHA commands were written to a socket.
func (s *ScriptSends) Sends() int64 { return s.sends.Load() }

// Resent returns Sends minus Calls: the re-sent scripts.
func (s *ScriptSends) Resent() int64 { return max(0, s.Sends()-s.Calls()) }

// Hook returns a redis.Hook counting script calls; add it with AddHook.
func (s *ScriptSends) Hook() redis.Hook { return scriptHook{s} }

// Dialer wraps dial (nil means a plain TCP dial) so that every connection
// counts the scripts written to it. Set it as redis.Options.Dialer.
func (s *ScriptSends) Dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, s: s}, nil
	}
}

var (
	evalshaWire = []byte("\r\nevalsha\r\n")
	evalWire    = []byte("\r\neval\r\n")
)

type countingConn struct {
	net.Conn
	s *ScriptSends
}

func (c *countingConn) Write(b []byte) (int, error) {
	low := bytes.ToLower(b)
	if n := bytes.Count(low, evalshaWire) + bytes.Count(low, evalWire); n > 0 {
		c.s.sends.Add(int64(n))
	}
	return c.Conn.Write(b)
}

type scriptHook struct{ s *ScriptSends }

func (h scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := strings.ToLower(cmd.Name()); n == "evalsha" || n == "eval" {
			h.s.calls.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if n := strings.ToLower(cmd.Name()); n == "evalsha" || n == "eval" {
				h.s.calls.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// SkewedClock is a worker clock that is far off and jumps: each reading is
// the real time plus a fixed offset plus a random jump of up to ±Jump. The
// library reads no worker clock for any lease decision (leases are decided
// by the database's clock and Redis's TTLs, and a worker measures its own
// deadline on the monotonic clock); the only clock it accepts is the Redis
// breaker's (the internal fastpath.Hooks.Now), so that is where a skewed
// clock goes, and nothing about the guarantee may change.
type SkewedClock struct {
	Offset time.Duration
	Jump   time.Duration

	mu    sync.Mutex
	rnd   *rand.Rand
	reads atomic.Int64
}

// NewSkewedClock returns a clock off by offset, jumping by up to ±jump per
// reading, with jumps drawn from seed.
func NewSkewedClock(offset, jump time.Duration, seed uint64) *SkewedClock {
	return &SkewedClock{Offset: offset, Jump: jump, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Now returns the skewed time. Its result carries no monotonic reading, so
// differences between two readings are as far off as the clock.
func (c *SkewedClock) Now() time.Time {
	c.reads.Add(1)
	var j time.Duration
	if c.Jump > 0 {
		c.mu.Lock()
		j = time.Duration(c.rnd.Int64N(int64(2*c.Jump))) - c.Jump
		c.mu.Unlock()
	}
	return time.Now().Round(0).Add(c.Offset + j)
}

// Reads returns how many times the clock was read.
func (c *SkewedClock) Reads() int64 { return c.reads.Load() }

// Pause stops the calling worker for d regardless of any context, the way
// a GC pause, a stopped VM or SIGSTOP stops a process: the worker cannot
// notice that its lease ran out meanwhile. It counts into n when n is not
// nil.
func Pause(d time.Duration, n *atomic.Int64) {
	if n != nil {
		n.Add(1)
	}
	time.Sleep(d)
}
