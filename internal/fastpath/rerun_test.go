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
			if err := direct.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}

			ref, owner := refFor(t, "k"), uuid.New()
			k := s.Keys(ref)
			// A counter far ahead of claim.lua's clock term: every
			// proposal is counter + 1, so an extra one would show.
			ahead := clockFloor(redisTime(t, direct)) + 1_000_000_000
			if err := direct.Set(ctx, k.Gen, genOf(ahead), retention).Err(); err != nil {
				t.Fatal(err)
			}
			want := genOf(ahead + 1)
			r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: owner, Lease: lease, Retention: retention})
			if c.wantErr {
				if !errors.Is(err, fastpath.ErrUnavailable) {
					t.Fatalf("Claim = %+v, %v; want ErrUnavailable", r, err)
				}
			} else if err != nil || r.Status != fastpath.ClaimAcquired || r.Generation != ahead+1 {
				t.Fatalf("Claim = %+v, %v; want Acquired generation %d", r, err, ahead+1)
			}

			runs := scriptRuns(t, direct)
			if runs < 3 {
				t.Fatalf("claim.lua ran %d times on the server; the test needs the re-run hazard (>= 3)", runs)
			}
			t.Logf("one Claim ran claim.lua %d times on the server", runs)
			if got := get(t, direct, k.Gen); got != want {
				t.Errorf("counter = %q after %d runs, want %s (one proposal)", got, runs, want)
			}
			if got := hget(t, direct, k.Lease, "o"); got != owner.String() {
				t.Errorf("lease owner = %q, want %s", got, owner)
			}
			if got := hget(t, direct, k.Lease, "g"); got != want {
				t.Errorf("lease generation = %q, want %s", got, want)
			}
			if n := direct.DBSize(ctx).Val(); n != 2 {
				t.Errorf("%d keys on the server, want 2 (lease and counter)", n)
			}
		})
	}
}
