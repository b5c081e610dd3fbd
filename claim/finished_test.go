package claim_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
)

// Issue 43: a finished operation always replays. A burst of concurrent
// retries of a finished operation is answered Replayed, every one, whatever
// the reason Redis has no copy of its result: too large to cache, lost
// (flushed), or Redis not asked at all (breaker open); through Claim, Do
// and DoTx. Before, the first retry took a Redis lease only to read the
// store and replay, and the retries beside it were told InProgress.

// retryPath is one way a retry reaches the Claimer.
type retryPath struct {
	name  string
	retry func(ctx context.Context, e *env, r claim.Request) (claim.Outcome, error)
}

var retryPaths = []retryPath{
	{"Claim", func(ctx context.Context, e *env, r claim.Request) (claim.Outcome, error) {
		return e.c.Claim(ctx, r)
	}},
	{"Do", func(ctx context.Context, e *env, r claim.Request) (claim.Outcome, error) {
		return e.c.Do(ctx, r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
			return durable.Result{}, fmt.Errorf("fn ran for a retry of a finished operation")
		})
	}},
	{"DoTx", func(ctx context.Context, e *env, r claim.Request) (claim.Outcome, error) {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return claim.Outcome{}, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		out, finish, err := e.c.DoTx(ctx, tx, r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
			return durable.Result{}, fmt.Errorf("fn ran for a retry of a finished operation")
		})
		finish(ctx, fmt.Errorf("rolled back"))
		return out, err
	}},
}

// burst sends n concurrent retries of r through path and wants each
// Replayed with body.
func burst(t *testing.T, e *env, path retryPath, r claim.Request, n int, body []byte) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	kinds := make([]claim.Kind, n)
	errs := make([]error, n)
	bodies := make([][]byte, n)
	for i := range n {
		wg.Go(func() {
			<-start
			out, err := path.retry(t.Context(), e, r)
			kinds[i], errs[i] = out.Kind, err
			if out.Result != nil {
				bodies[i] = out.Result.Body
			}
		})
	}
	close(start)
	wg.Wait()
	replayed := 0
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Errorf("%s retry %d: %v", path.name, i, errs[i])
		case kinds[i] != claim.Replayed:
			t.Errorf("%s retry %d: %v, want replayed: the operation is finished", path.name, i, kinds[i])
		case !bytes.Equal(bodies[i], body):
			t.Errorf("%s retry %d: body of %d bytes, want the stored %d", path.name, i, len(bodies[i]), len(body))
		default:
			replayed++
		}
	}
	if replayed != n {
		t.Fatalf("%s: %d of %d concurrent retries of a finished operation replayed", path.name, replayed, n)
	}
}

// finish runs r once through Do and returns the stored body.
func finish(t *testing.T, e *env, r claim.Request, body []byte) {
	t.Helper()
	out, err := e.c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		return durable.Result{StatusCode: 201, Body: body}, nil
	})
	if err != nil || out.Kind != claim.Executed {
		t.Fatalf("Do = %v, %v; want executed", out.Kind, err)
	}
	e.awaitRedisFinished(r)
}

// awaitRedisFinished waits until Redis holds r's finished result or marker:
// Do sends its Redis completion after the caller's answer. Without Redis it
// returns at once.
func (e *env) awaitRedisFinished(r claim.Request) {
	e.t.Helper()
	if e.rdb == nil {
		return
	}
	k := fastpath.KeysFor(e.prefix, e.ref(r))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		st, err := fastpath.ReadStored(e.t.Context(), e.rdb, k)
		if err == nil && (st.Kind == fastpath.StoredResult || st.Kind == fastpath.StoredFinished) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Redis holds %+v, %v 5s after Do returned; want its result", st, err)
		}
	}
}

func TestFinished_BurstsReplay(t *testing.T) {
	t.Parallel()
	large := bytes.Repeat([]byte("L"), 96<<10) // above the 64 KiB Redis caches
	small := []byte(`{"order":"o_1"}`)
	for _, c := range []struct {
		name string
		mode string
		body []byte
		// between runs before each burst (Redis lost the key).
		between func(e *env)
	}{
		{"TooLargeForRedis", withRedis, large, nil},
		{"RedisLostTheKey", withRedis, small, func(e *env) { e.flushRedis() }},
		{"RedisLostTheLargeKey", withRedis, large, func(e *env) { e.flushRedis() }},
		{"BreakerOpen", breakerOpen, small, nil},
		{"WithoutRedis", withoutRed, large, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, c.mode)
			for _, path := range retryPaths {
				r := req("finished-"+path.name, "v1:"+path.name)
				finish(t, e, r, c.body)
				// Every burst, not only the first: a result too large for
				// Redis is never cached, so each burst meets the same
				// Redis.
				for range 3 {
					if c.between != nil {
						c.between(e)
					}
					burst(t, e, path, r, 12, c.body)
				}
			}
		})
	}
}

// TestFinished_MarkerAnswersWithoutLease: after a retry of a finished
// operation whose result is too large for Redis, Redis holds the finished
// marker, not a lease, and a retry then takes none.
func TestFinished_MarkerAnswersWithoutLease(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis)
	r := req("marker", "v1:m")
	body := bytes.Repeat([]byte("L"), 96<<10)
	finish(t, e, r, body)
	k := fastpath.KeysFor(e.prefix, e.ref(r))
	for i := range 3 {
		st, err := fastpath.ReadStored(t.Context(), e.rdb, k)
		if err != nil {
			t.Fatal(err)
		}
		if st.Kind != fastpath.StoredFinished || st.Fingerprint != r.Fingerprint {
			t.Fatalf("after retry %d, Redis holds %+v, want the finished marker", i, st)
		}
		out := mustClaim(t, e.c, r, claim.Replayed)
		if !bytes.Equal(out.Result.Body, body) {
			t.Fatalf("replayed %d bytes, want %d", len(out.Result.Body), len(body))
		}
	}
	// Another payload under the key is refused by Redis alone.
	if _, err := e.c.Claim(t.Context(), req("marker", "v1:other")); !errors.Is(err, claim.ErrMismatch) {
		t.Fatalf("Claim with another payload = %v, want ErrMismatch", err)
	}
	// After a flush, the first retry puts the marker back.
	e.flushRedis()
	mustClaim(t, e.c, r, claim.Replayed)
	if st, err := fastpath.ReadStored(t.Context(), e.rdb, k); err != nil || st.Kind != fastpath.StoredFinished {
		t.Fatalf("after a flush and a retry, Redis holds %+v, %v; want the finished marker", st, err)
	}
}

// TestFinished_TentativeLeaseIsNotInProgress forces the window: a retry
// has taken the key in Redis (its tentative lease) and has not reached the
// store yet. A retry beside it reads the store and replays; a retry of an
// operation that is really in progress is still answered InProgress.
func TestFinished_TentativeLeaseIsNotInProgress(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis)
	scripts, err := fastpath.New(e.rdb, fastpath.Options{Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	r := req("tentative", "v1:t")
	finish(t, e, r, []byte("done"))
	e.flushRedis()
	// The stalled retry: claim.lua ran, the durable claim did not.
	rep, err := scripts.Claim(t.Context(), e.ref(r), fastpath.ClaimArgs{Fingerprint: r.Fingerprint, Owner: uuid.New(), Lease: 30 * time.Second})
	if err != nil || rep.Status != fastpath.ClaimAcquired {
		t.Fatalf("stalled retry's claim.lua = %+v, %v", rep, err)
	}
	out := mustClaim(t, e.c, r, claim.Replayed)
	if string(out.Result.Body) != "done" {
		t.Fatalf("replayed %q", out.Result.Body)
	}

	// A fresh key whose holder's lease is still tentative: in progress.
	fresh := req("tentative-fresh", "v1:t")
	if rep, err := scripts.Claim(t.Context(), e.ref(fresh), fastpath.ClaimArgs{Fingerprint: fresh.Fingerprint, Owner: uuid.New(), Lease: 30 * time.Second}); err != nil || rep.Status != fastpath.ClaimAcquired {
		t.Fatalf("holder's claim.lua = %+v, %v", rep, err)
	}
	if out := mustClaim(t, e.c, fresh, claim.InProgress); out.RetryAfter <= 0 {
		t.Fatalf("RetryAfter = %v", out.RetryAfter)
	}
}

// TestWait_WaitersWokenTogether: 20 duplicates wait (WithWait) on a key a
// workflow holds; when the holder completes, every one replays, through
// Claim and Do, and they were woken by the holder's finish through Redis,
// not by their poll (oncekey.waits.woken). For a result too large for Redis
// too: the woken waiters replay from the store.
func TestWait_WaitersWokenTogether(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		body []byte
	}{{"Small", []byte(`{"order":"o_1"}`)}, {"TooLargeForRedis", bytes.Repeat([]byte("L"), 96<<10)}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			mp := newRecorder()
			e := setup(t, withRedis, claim.WithWait(20*time.Second), claim.WithMeterProvider(mp))
			r := req("waited", "v1:w")
			held := mustClaim(t, e.c, r, claim.Acquired)
			const n = 20
			kinds := make([]claim.Kind, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				path := retryPaths[i%2] // Claim and Do
				wg.Go(func() {
					out, err := path.retry(t.Context(), e, r)
					kinds[i], errs[i] = out.Kind, err
					if err == nil && out.Kind == claim.Replayed && !bytes.Equal(out.Result.Body, c.body) {
						errs[i] = fmt.Errorf("replayed %d bytes, want %d", len(out.Result.Body), len(c.body))
					}
				})
			}
			// Let the waiters reach their wait: the first answer comes
			// back InProgress at once, and the watch is set up after it.
			// On a loaded machine that takes long: wait until every one
			// watches (bounded; the assertion below allows stragglers).
			for deadline := time.Now().Add(10 * time.Second); claim.Watching(e.c, r) < n && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			if err := held.Lease.Complete(t.Context(), durable.Result{StatusCode: 201, Body: c.body}); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			for i := range n {
				if errs[i] != nil || kinds[i] != claim.Replayed {
					t.Errorf("waiter %d: %v, %v; want replayed", i, kinds[i], errs[i])
				}
			}
			sums, err := mp.Collect(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			// A waiter that had not reached its wait when the holder
			// finished replays on its second look, unwoken; most are
			// woken. The wake is complete.lua's: when its call did not
			// land (a Redis call past its timeout on a loaded machine),
			// none was sent and every waiter replays by its poll, which
			// the loop above checked.
			st, err := fastpath.ReadStored(t.Context(), e.rdb, fastpath.KeysFor(e.prefix, e.ref(r)))
			if err != nil || st.Kind != fastpath.StoredResult && st.Kind != fastpath.StoredFinished {
				t.Logf("the holder's Redis completion did not land (%v, %v): no wake was sent; woken not checked", st.Kind, err)
				return
			}
			if got := sums["oncekey.waits.woken"]; got < n/2 {
				t.Errorf("oncekey.waits.woken = %d of %d waiters; want most woken by the holder's finish", got, n)
			}
		})
	}
}

// TestWait_WithoutRedisPolls: without Redis, a waiting duplicate of a
// workflow is answered by its poll once the holder completes.
func TestWait_WithoutRedisPolls(t *testing.T) {
	t.Parallel()
	e := setup(t, breakerOpen, claim.WithWait(20*time.Second))
	r := req("waited", "v1:w")
	held := mustClaim(t, e.c, r, claim.Acquired)
	done := make(chan claim.Outcome, 1)
	go func() {
		out, err := e.c.Claim(t.Context(), r)
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	time.Sleep(50 * time.Millisecond)
	if err := held.Lease.Complete(t.Context(), result("done")); err != nil {
		t.Fatal(err)
	}
	if out := <-done; out.Kind != claim.Replayed {
		t.Fatalf("waiter = %v, want replayed", out.Kind)
	}
}

// TestWait_LostLeaseNoWakeLoop: Redis lost the holder's lease while
// duplicates wait. One of them takes the key in Redis, the store refuses
// it (the holder has the record) and it gives the Redis lease back without
// waking the others: otherwise each would take the key in turn, wake the
// rest, and the store would serve a claim per turn for as long as the work
// runs.
func TestWait_LostLeaseNoWakeLoop(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis, claim.WithWait(800*time.Millisecond))
	r := req("lost-lease", "v1:w")
	held := mustClaim(t, e.c, r, claim.Acquired)
	defer func() { _ = held.Lease.Complete(context.WithoutCancel(t.Context()), result("done")) }()
	e.flushRedis()
	e.stmts.Reset()
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			out, err := e.c.Claim(t.Context(), r)
			if err != nil || out.Kind != claim.InProgress {
				t.Errorf("waiter = %v, %v; want in progress after its wait", out.Kind, err)
			}
		})
	}
	wg.Wait()
	// Each waiter looks a handful of times in 800ms (its first look, once
	// its watch is set, then its polls); a wake loop makes hundreds.
	if n := e.stmts.Count(); n > 60 {
		t.Fatalf("%d durable statements while 5 duplicates waited 800ms, want a few per waiter", n)
	}
}

// TestFinished_StaleConfirmedLeaseIsVerified: Redis holds a confirmed lease
// of a finished operation, as after a failover to a replica that saw the
// confirmation and not the completion. By default a retry reads the store
// and replays, however young the lease, and puts the result back in Redis.
// With lua.Options.TrustLease (the opt-in), a lease younger than it answers
// "in progress" alone: the control that shows the read is what replays.
func TestFinished_StaleConfirmedLeaseIsVerified(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis)
	trusting, err := claim.New[pgx.Tx](e.store, claim.WithRedis(e.rdb, lua.Options{Prefix: e.prefix, Timeout: time.Second, TrustLease: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	scripts, err := fastpath.New(e.rdb, fastpath.Options{Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	r := req("stale-confirmed", "v1:s")
	finish(t, e, r, []byte("done"))
	leftover := func() {
		t.Helper()
		e.flushRedis()
		// The replica's leftover: a lease taken and confirmed, a minute long.
		owner := uuid.New()
		rep, err := scripts.Claim(t.Context(), e.ref(r), fastpath.ClaimArgs{Fingerprint: r.Fingerprint, Owner: owner, Lease: time.Minute})
		if err != nil || rep.Status != fastpath.ClaimAcquired {
			t.Fatalf("claim.lua = %+v, %v", rep, err)
		}
		rec, err := e.store.Get(t.Context(), e.ref(r))
		if err != nil {
			t.Fatal(err)
		}
		// Confirmed under the record's generation, as its holder confirmed it.
		if err := scripts.SyncGen(t.Context(), e.ref(r), fence.Token{Generation: rec.Token.Generation, Owner: owner}); err != nil {
			t.Fatal(err)
		}
	}
	leftover()
	mustClaim(t, trusting, r, claim.InProgress)
	out := mustClaim(t, e.c, r, claim.Replayed)
	if string(out.Result.Body) != "done" {
		t.Fatalf("replayed %q", out.Result.Body)
	}
	if st, err := fastpath.ReadStored(t.Context(), e.rdb, fastpath.KeysFor(e.prefix, e.ref(r))); err != nil || st.Kind != fastpath.StoredResult {
		t.Fatalf("Redis after the verified retry = %+v, %v; want the result back", st, err)
	}
	leftover()
	const n = 8
	outs := make(chan claim.Kind, n)
	for range n {
		go func() {
			out, err := e.c.Claim(t.Context(), r)
			if err != nil {
				t.Error(err)
			}
			outs <- out.Kind
		}()
	}
	for range n {
		if k := <-outs; k != claim.Replayed {
			t.Fatalf("a concurrent retry of a young leftover lease got %v, want Replayed", k)
		}
	}
	if _, err := claim.New[pgx.Tx](e.store, claim.WithRedis(e.rdb, lua.Options{TrustLease: -time.Second})); !errors.Is(err, claim.ErrConfig) {
		t.Fatalf("negative TrustLease: New = %v, want ErrConfig", err)
	}
}

// TestClaim_ConfirmsItsLease: once the store granted a Claim, its Redis
// lease is confirmed (sent off the caller's path). A duplicate is answered
// "in progress" after one read of the record by default, and by Redis alone
// with TrustLease.
func TestClaim_ConfirmsItsLease(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis)
	r := req("confirmed", "v1:c")
	mustClaim(t, e.c, r, claim.Acquired)
	k := fastpath.KeysFor(e.prefix, e.ref(r))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		st, err := fastpath.ReadStored(t.Context(), e.rdb, k)
		if err == nil && st.Kind == fastpath.StoredLease && !st.Tentative {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis holds %+v, %v 5s after the grant; want a confirmed lease", st, err)
		}
	}
	e.stmts.Reset()
	mustClaim(t, e.c, r, claim.InProgress)
	if n := e.stmts.Count(); n != 1 {
		t.Fatalf("a duplicate of a confirmed lease sent %d statements; want the one read of the record", n)
	}
	trusting, err := claim.New[pgx.Tx](e.store, claim.WithRedis(e.rdb, lua.Options{Prefix: e.prefix, Timeout: time.Second, TrustLease: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	e.stmts.Reset()
	mustClaim(t, trusting, r, claim.InProgress)
	if n := e.stmts.Count(); n != 0 {
		t.Fatalf("with TrustLease a duplicate of a confirmed lease sent %d statements; want Redis alone", n)
	}
}
