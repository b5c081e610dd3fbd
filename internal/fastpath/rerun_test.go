package fastpath_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// delayProxy forwards TCP to a Redis server. On the first delayConns
// connections that send a script (EVALSHA or EVAL), it holds the server's
// replies back for delay: the script runs on the server, its reply arrives
// after the client stopped reading. Later connections pass straight through.
type delayProxy struct {
	t          *testing.T
	ln         net.Listener
	upstream   string
	delay      time.Duration
	delayConns int64
	delayed    atomic.Int64
	wg         sync.WaitGroup
}

func newDelayProxy(t *testing.T, upstream string, delay time.Duration, delayConns int64) *delayProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &delayProxy{t: t, ln: ln, upstream: upstream, delay: delay, delayConns: delayConns}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *delayProxy) Addr() string { return p.ln.Addr().String() }

func (p *delayProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.handle(c) }()
	}
}

func (p *delayProxy) handle(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer server.Close()
	var delayThis atomic.Bool
	done := make(chan struct{})
	go func() { // client → server, watching for a script
		defer close(done)
		defer server.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				up := bytes.ToUpper(buf[:n])
				if !delayThis.Load() && bytes.Contains(up, []byte("EVAL")) && p.delayed.Add(1) <= p.delayConns {
					delayThis.Store(true)
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for { // server → client, late when this connection is delayed
		n, err := server.Read(buf)
		if n > 0 {
			if delayThis.Load() {
				time.Sleep(p.delay)
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	client.Close()
	<-done
}

// scriptRuns returns how many times EVALSHA ran successfully on the server
// (INFO commandstats).
func scriptRuns(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`cmdstat_evalsha:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestClaim_DelayedReplyRerun forces the hazard measured before this code
// was written: go-redis re-sends a command whose reply timed out, so one
// Claim runs claim.lua several times on the server. The owner must end with
// one lease and one proposal.
func TestClaim_DelayedReplyRerun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		delayConns int64
		wantErr    bool
	}{
		// Two attempts time out, the third gets its reply.
		{name: "RetrySucceedsWithSameGeneration", delayConns: 2},
		// Every attempt (1 + MaxRetries 3) times out.
		{name: "AllAttemptsTimeOut", delayConns: 100, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redisproc.Start(t, redisproc.Options{})
			direct := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			t.Cleanup(func() { direct.Close() })
			proxy := newDelayProxy(t, srv.Addr(), time.Second, c.delayConns)
			client := redis.NewClient(&redis.Options{
				Addr:            proxy.Addr(),
				ReadTimeout:     250 * time.Millisecond, // the reply comes 1s late
				MaxRetries:      3,                      // go-redis's default, spelled out
				MinRetryBackoff: time.Millisecond,
				MaxRetryBackoff: 5 * time.Millisecond,
			})
			t.Cleanup(func() { client.Close() })
			// The wrapper's timeout leaves room for all of go-redis's retries.
			s, err := fastpath.New(client, fastpath.Options{Prefix: "rerun", Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			// So every run is an EVALSHA. The scripts are loaded straight
			// into the server's cache, not through the proxy, whose 250ms
			// read timeout a loaded machine can miss before any delay.
			loader, err := fastpath.New(direct, fastpath.Options{Prefix: "rerun"})
			if err != nil {
				t.Fatal(err)
			}
			if err := loader.Load(ctx); err != nil {
				t.Fatal(err)
			}
			ref, owner := refFor(t, "k"), uuid.New()
			k := s.Keys(ref)
			before := redisTime(t, direct)
			if err := direct.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: owner, Lease: lease})
			if c.wantErr {
				if !errors.Is(err, fastpath.ErrUnavailable) {
					t.Fatalf("Claim = %+v, %v; want ErrUnavailable", r, err)
				}
			} else if err != nil || r.Status != fastpath.ClaimAcquired {
				t.Fatalf("Claim = %+v, %v; want Acquired", r, err)
			}

			runs := scriptRuns(t, direct)
			if runs < 3 {
				t.Fatalf("claim.lua ran %d times on the server; the test needs the re-run hazard (>= 3)", runs)
			}
			t.Logf("one Claim ran claim.lua %d times on the server", runs)
			// One proposal (one TIME) and one write, however many runs: the
			// later runs find the owner's lease and return its generation.
			calls := commandCalls(t, direct)
			if calls["time"] != 1 || calls["set"] != 1 || calls["get"] != runs {
				t.Errorf("server calls %v for %d runs, want one time, one set and a get per run", calls, runs)
			}
			st := stored(t, direct, k)
			wantLease(t, st, owner, st.Generation, fp, lease)
			wantClockProposal(t, st.Generation, before, redisTime(t, direct))
			if !c.wantErr && r.Generation != st.Generation {
				t.Errorf("Claim answered generation %d, the lease holds %d", r.Generation, st.Generation)
			}
			if n := direct.DBSize(ctx).Val(); n != 1 {
				t.Errorf("%d keys on the server, want 1 (the record)", n)
			}
		})
	}
}
