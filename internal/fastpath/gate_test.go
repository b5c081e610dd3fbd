package fastpath_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// pipeCounter is a go-redis hook that counts the script calls sent alone
// and the pipelines of script calls, with their longest length (the
// client's own commands, such as HELLO on a new connection, are not
// counted).
type pipeCounter struct {
	single, pipes, longest atomic.Int64
}

func (h *pipeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.single.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !isScript(cmds[0]) {
			return next(ctx, cmds)
		}
		h.pipes.Add(1)
		for n := int64(len(cmds)); ; {
			l := h.longest.Load()
			if n <= l || h.longest.CompareAndSwap(l, n) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

func isScript(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

// gatedScripts is a Scripts on a client of addr with a pool of poolSize
// connections, its calls counted by the returned hook. A zero poolTimeout
// is go-redis's default.
func gatedScripts(t *testing.T, addr string, poolSize int, poolTimeout time.Duration) (*fastpath.Scripts, *pipeCounter, *redis.Client) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize, PoolTimeout: poolTimeout, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	h := &pipeCounter{}
	c.AddHook(h)
	s, err := fastpath.New(c, fastpath.Options{Prefix: "gate", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s, h, c
}

// answer is what one caller of a burst got back: the cached result its
// second claim replayed, for the key it claimed.
type answer struct {
	key  string
	body string
	err  error
}

// ownAnswers checks that every caller replayed the body it completed its
// own key with. It is the test's whole claim about pipelines: a reply
// delivered to the wrong call would replay another key's result.
func ownAnswers(answers []answer) error {
	for i, a := range answers {
		if a.err != nil {
			return fmt.Errorf("caller %d: %w", i, a.err)
		}
		if a.body != "result of "+a.key {
			return fmt.Errorf("caller %d claimed %s and replayed %q", i, a.key, a.body)
		}
	}
	return nil
}

// roundTrip claims a key of its own, completes it with a body naming the
// key, then claims it again and returns the replayed body.
func roundTrip(ctx context.Context, t *testing.T, s *fastpath.Scripts, key string) answer {
	ref := refFor(t, key)
	owner := uuid.New()
	r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: owner, Lease: lease})
	if err != nil {
		return answer{key: key, err: err}
	}
	if r.Status != fastpath.ClaimAcquired {
		return answer{key: key, err: fmt.Errorf("first claim of %s: %v, want acquired", key, r.Status)}
	}
	tok := fence.Token{Generation: r.Generation, Owner: owner}
	res := durable.Result{StatusCode: 201, Body: []byte("result of " + key)}
	if _, err := s.Complete(ctx, ref, tok, fp, durable.Completed, res, time.Hour); err != nil {
		return answer{key: key, err: err}
	}
	r, err = s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
	if err != nil {
		return answer{key: key, err: err}
	}
	if r.Status != fastpath.ClaimCached {
		return answer{key: key, err: fmt.Errorf("second claim of %s: %v, want cached", key, r.Status)}
	}
	return answer{key: key, body: string(r.Cached.Result.Body)}
}

// burstRoundTrips runs n callers at once, each with roundTrip.
func burstRoundTrips(t *testing.T, s *fastpath.Scripts, n int) []answer {
	t.Helper()
	answers := make([]answer, n)
	atOnce(t, n, func(i int) {
		answers[i] = roundTrip(context.Background(), t, s, fmt.Sprintf("k%d-%s", i, uuid.NewString()))
	})
	return answers
}

// TestGate_QueuedCallsShareAPipelineAndGetTheirOwnReplies: 200 callers at
// once on a pool of one connection, each claiming, completing and
// replaying a key of its own. The calls that find the connection taken go
// out in pipelines, and each caller still replays its own result.
func TestGate_QueuedCallsShareAPipelineAndGetTheirOwnReplies(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{})
	s, h, _ := gatedScripts(t, srv.Addr(), 1, 0)
	if err := ownAnswers(burstRoundTrips(t, s, 200)); err != nil {
		t.Fatal(err)
	}
	if h.longest.Load() < 2 {
		t.Fatalf("%d pipelines, the longest of %d calls: the burst never queued, so it tested nothing", h.pipes.Load(), h.longest.Load())
	}
	t.Logf("%d calls sent alone, %d pipelines, the longest of %d calls", h.single.Load(), h.pipes.Load(), h.longest.Load())
}

// The check above catches a reply delivered to another caller.
func TestGate_NegativeControl_OwnAnswersCatchesASwap(t *testing.T) {
	t.Parallel()
	answers := []answer{{key: "a", body: "result of a"}, {key: "b", body: "result of b"}}
	if err := ownAnswers(answers); err != nil {
		t.Fatalf("own answers: %v", err)
	}
	answers[0].body, answers[1].body = answers[1].body, answers[0].body
	if err := ownAnswers(answers); err == nil {
		t.Fatal("two callers' replies swapped, and ownAnswers passed them")
	}
}

// TestGate_CallsAloneAreNotPipelined: calls one after another never find
// the connection taken, and go out alone.
func TestGate_CallsAloneAreNotPipelined(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{})
	s, h, _ := gatedScripts(t, srv.Addr(), 1, 0)
	if err := s.Load(context.Background()); err != nil { // no NOSCRIPT, no EVAL
		t.Fatal(err)
	}
	for i := range 20 {
		if err := ownAnswers([]answer{roundTrip(context.Background(), t, s, fmt.Sprint("alone", i))}); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.pipes.Load(); n != 0 || h.single.Load() != 60 {
		t.Fatalf("%d pipelines and %d calls alone, want 0 and 60", n, h.single.Load())
	}
}

// TestGate_PipelineFallsBackToEvalOnNoScript: after SCRIPT FLUSH (a
// restarted server), each call of a pipeline is answered NOSCRIPT and sent
// again with EVAL; every caller still gets its own reply.
func TestGate_PipelineFallsBackToEvalOnNoScript(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{})
	s, h, c := gatedScripts(t, srv.Addr(), 1, 0)
	if err := ownAnswers(burstRoundTrips(t, s, 50)); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	before := h.pipes.Load()
	if err := ownAnswers(burstRoundTrips(t, s, 200)); err != nil {
		t.Fatal(err)
	}
	if h.pipes.Load() == before {
		t.Fatal("no pipeline after the flush: the fallback in a pipeline was not tested")
	}
	n, err := c.Do(context.Background(), "SCRIPT", "EXISTS", fastpath.ScriptSHA("claim.lua")).Slice()
	if err != nil || len(n) != 1 || n[0] != int64(1) {
		t.Fatalf("claim.lua not in the script cache after the burst: %v, %v", n, err)
	}
}

// TestGate_QueuedCallWithdrawnUnsent: with the one connection held by a
// call Redis answers slowly (300ms), a second call queues; its context
// ends, or the client's PoolTimeout (50ms) runs out, and it returns
// unsent: the key it would have claimed is still free. A call sent anyway
// would have claimed it.
func TestGate_QueuedCallWithdrawnUnsent(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{})
	for _, tc := range []struct {
		name        string
		poolTimeout time.Duration
		cancel      bool
		want        error
	}{
		{"ContextEnds", time.Minute, true, context.Canceled},
		{"PoolTimeout", 50 * time.Millisecond, false, redis.ErrPoolTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			front := newTCPFront(t, srv.Addr(), 300*time.Millisecond)
			s, _, _ := gatedScripts(t, front.addr(), 1, tc.poolTimeout)
			first := holdTheConnection(t, s, front)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			queuedErr := make(chan error, 1)
			go func() {
				_, err := s.Claim(ctx, refFor(t, "queued"), fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
				queuedErr <- err
			}()
			if tc.cancel {
				time.Sleep(20 * time.Millisecond) // let it queue; were it sent, the check below finds its claim
				cancel()
			}
			if err := <-queuedErr; !errors.Is(err, tc.want) || !errors.Is(err, fastpath.ErrUnavailable) {
				t.Fatalf("queued call = %v, want ErrUnavailable wrapping %v", err, tc.want)
			}
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			r, err := s.Claim(context.Background(), refFor(t, "queued"), fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
			if err != nil || r.Status != fastpath.ClaimAcquired {
				t.Fatalf("claim after the withdrawn call = %v, %v; want acquired: the withdrawn call was sent", r.Status, err)
			}
			if s.Breaker() != fastpath.BreakerClosed {
				t.Fatalf("breaker %v after a call withdrawn unsent, want closed", s.Breaker())
			}
		})
	}
}

// holdTheConnection sends a Claim through s, whose pool has one
// connection, to front, which answers slowly, and returns once it is in
// flight: the call holds the connection until its reply, which the
// returned channel then carries.
func holdTheConnection(t *testing.T, s *fastpath.Scripts, front *tcpFront) <-chan error {
	t.Helper()
	first := make(chan error, 1)
	go func() {
		_, err := s.Claim(context.Background(), refFor(t, "slow"), fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
		first <- err
	}()
	waitInFlight(t, front)
	return first
}

// waitInFlight waits until front has a connection: the first call holds
// the pool's one connection.
func waitInFlight(t *testing.T, front *tcpFront) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		front.mu.Lock()
		n := len(front.conns)
		front.mu.Unlock()
		if n > 0 {
			time.Sleep(10 * time.Millisecond) // its command written
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection to the front after 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGate_QueuedCompleteCountsItsWaitInTheTTL: a Complete that queued
// behind a slow call (300ms) caches its result until its TTL after the
// caller asked, not after the pipeline sent it: the wait comes off the TTL
// sent to Redis. Without that, the cached result would outlive the
// record's retention by the wait.
func TestGate_QueuedCompleteCountsItsWaitInTheTTL(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{})
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { direct.Close() })
	ds, err := fastpath.New(direct, fastpath.Options{Prefix: "gate", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The scripts are loaded: a NOSCRIPT reply would add a round trip
	// between the send and the run, which no TTL argument can know of.
	if err := ds.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ref, owner := refFor(t, "ttl"), uuid.New()
	r, err := ds.Claim(context.Background(), ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: owner, Lease: lease})
	if err != nil || r.Status != fastpath.ClaimAcquired {
		t.Fatalf("claim = %v, %v", r.Status, err)
	}

	const delay = 300 * time.Millisecond
	front := newTCPFront(t, srv.Addr(), delay)
	s, _, _ := gatedScripts(t, front.addr(), 1, time.Minute)
	first := holdTheConnection(t, s, front)
	asked := time.Now()
	const ttl = time.Hour
	tok := fence.Token{Generation: r.Generation, Owner: owner}
	cached, err := s.Complete(context.Background(), ref, tok, fp, durable.Completed, durable.Result{StatusCode: 201, Body: []byte("x")}, ttl)
	if err != nil || !cached {
		t.Fatalf("complete = %v, %v; want cached", cached, err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	pttl, err := direct.PTTL(context.Background(), ds.Keys(ref).Record).Result()
	if err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(pttl)
	// The call queued for most of the slow call's 300ms; sent alone, the
	// result would expire at least that much later than asked + ttl. The
	// slack covers the clock reads and Redis's millisecond rounding.
	if late := expires.Sub(asked.Add(ttl)); late > delay/3 {
		t.Fatalf("cached result expires %v after asked + TTL: the queue wait was not taken off the TTL", late)
	}
	if early := asked.Add(ttl).Sub(expires); early > 5*time.Second {
		t.Fatalf("cached result expires %v before asked + TTL", early)
	}
}

// callerID is a context key: the caller a context belongs to.
type callerID struct{}

// pipeContexts is a go-redis hook that records, for each pipeline of
// script calls, the key of its first call and the caller in its context.
type pipeContexts struct {
	mu    sync.Mutex
	first []string
	ids   []any
}

func (h *pipeContexts) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipeContexts) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipeContexts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if isScript(cmds[0]) {
			h.mu.Lock()
			key := cmds[0].Args()[3] // evalsha sha numkeys key ...
			if p, ok := key.(*string); ok {
				key = *p // the library passes its arguments by pointer
			}
			h.first = append(h.first, fmt.Sprint(key))
			h.ids = append(h.ids, ctx.Value(callerID{}))
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// TestGate_PipelineCarriesItsFirstCallersContext: a pipeline is sent with
// the context values of its first call's caller (what a tracing hook
// reads to put the send in that caller's trace).
func TestGate_PipelineCarriesItsFirstCallersContext(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{})
	s, _, c := gatedScripts(t, srv.Addr(), 1, 0)
	h := &pipeContexts{}
	c.AddHook(h)
	const n = 200
	keyOf := map[string]int{} // a caller's record key → the caller
	refs := make([]durable.Ref, n)
	for i := range refs {
		refs[i] = refFor(t, fmt.Sprint("ctx", i))
		keyOf[s.Keys(refs[i]).Record] = i
	}
	errs := make([]error, n)
	atOnce(t, n, func(i int) {
		ctx := context.WithValue(context.Background(), callerID{}, i)
		_, errs[i] = s.Claim(ctx, refs[i], fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.first) == 0 {
		t.Fatal("no pipeline: the burst never queued, so it tested nothing")
	}
	for i, k := range h.first {
		want, ok := keyOf[k]
		if !ok {
			t.Fatalf("pipeline %d's first call is for %q, no caller's key", i, k)
		}
		if h.ids[i] != want {
			t.Fatalf("pipeline %d was sent with caller %v's context, its first call is caller %d's", i, h.ids[i], want)
		}
	}
	t.Logf("%d pipelines, each with its first caller's context", len(h.first))
}
