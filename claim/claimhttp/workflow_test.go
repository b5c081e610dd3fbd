package claimhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// The tests in this file force the paths on which the first cut of the
// workflow mode ran one key's effect twice: after the handler started,
// the middleware released the key on its own. Each asserts one effect (one
// order row) and that every retry replays or waits.

// setupFlaky is setup with a store whose writes fail as unreachable for
// a while: renewals while RenewDown, and Complete, Fail and MarkUncertain
// while FinishDown (not inside the caller's transaction).
func setupFlaky(t *testing.T, withRedis bool, lease time.Duration, opts ...claimhttp.Option) (*fixture, *settletest.Flaky) {
	t.Helper()
	fl := &settletest.Flaky{Finishing: settletest.Complete | settletest.Fail | settletest.MarkUncertain, OutsideTx: true}
	f := setup(t, config{
		redis:   withRedis,
		claim:   []claim.Option{claim.WithLease(lease)},
		options: opts,
		wrap:    fl.Wrap,
	})
	return f, fl
}

func redisModes(t *testing.T, fn func(t *testing.T, withRedis bool)) {
	for _, withRedis := range []bool{true, false} {
		t.Run(map[bool]string{true: "WithRedis", false: "WithoutRedis"}[withRedis], func(t *testing.T) {
			t.Parallel()
			fn(t, withRedis)
		})
	}
}

// wantOneEffect checks that the key ran its effect once, that the record is
// finished in state, and that a retry replays without running.
func wantOneEffect(t *testing.T, f *fixture, tenant, key, body string, state durable.State) {
	t.Helper()
	rec, err := f.record(tenant, key)
	if err != nil || rec.State != state {
		t.Fatalf("record = %+v, %v; want %s", rec, err, state)
	}
	runs := f.runs.Load()
	again := f.post(tenant, key, body)
	if state.Finished() && again.Header().Get(claimclient.HeaderReplayed) != "true" {
		t.Fatalf("retry = %d %s, want a replay", again.Code, again.Body)
	}
	if f.runs.Load() != runs {
		t.Fatal("the handler ran again")
	}
	if n := f.rows(tenant); n != 1 {
		t.Fatalf("order rows = %d, want 1", n)
	}
}

// Issue path 1: the store refuses renewals for longer than the lease while
// the handler works after its effect; no one takes over, so the fenced
// completion succeeds and the response is published. (The first cut
// answered 503 "not processed" and released, and the retry charged again.)
func TestWorkflow_RenewalsFailWhileTheHandlerWorks(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	redisModes(t, func(t *testing.T, withRedis bool) {
		for _, tc := range []struct {
			name, body string
			status     int
			state      durable.State
		}{
			{"Completes", `{"item":"book"}`, http.StatusCreated, durable.Completed},
			{"MarkedUncertainStaysUncertain", `{"item":"book","uncertain":true}`, http.StatusAccepted, durable.Uncertain},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f, fl := setupFlaky(t, withRedis, lease)
				outage := func(*http.Request) {
					fl.RenewDown.Store(true)
					time.Sleep(lease * 2) // longer than the lease, unrenewed
					fl.RenewDown.Store(false)
				}
				f.afterEffect(outage)
				f.hook(func(n int64, r *http.Request) {
					if tc.state == durable.Uncertain { // MarkUncertain returns before the insert
						outage(r)
						_, _ = f.schema.Pool.Exec(context.Background(), `INSERT INTO orders (tenant, item, op) VALUES ($1, 'charge', 'x')`, t.Name())
					}
				})
				tenant := t.Name()
				w := f.post(tenant, "k-renew", tc.body)
				if w.Code != tc.status {
					t.Fatalf("first = %d %s, want %d", w.Code, w.Body, tc.status)
				}
				if fl.Renews.Load() == 0 {
					t.Fatal("no renewal was attempted: the outage was not exercised")
				}
				wantOneEffect(t, f, tenant, "k-renew", tc.body, tc.state)
			})
		}
	})
}

// Issue path 2: the client goes away mid-handler. The handler's context is
// not cancelled, the lease is renewed until the handler returns, and the
// client's retry waits (409) instead of taking the key over.
func TestWorkflow_ClientDisconnectDoesNotStopTheWork(t *testing.T) {
	t.Parallel()
	const lease = time.Second // long enough that a loaded machine still renews in time
	redisModes(t, func(t *testing.T, withRedis bool) {
		f, fl := setupFlaky(t, withRedis, lease)
		tenant := t.Name()
		effect := make(chan struct{})
		var once sync.Once
		var handlerCtxErr atomic.Value
		f.afterEffect(func(r *http.Request) {
			once.Do(func() { close(effect) }) // a second run is a failure reported below, not a panic
			time.Sleep(lease * 3)             // work that outlives its client and three leases
			handlerCtxErr.Store(fmt.Sprint(r.Context().Err()))
		})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() {
			f.serve(newRequest(tenant, http.MethodPost, "/orders", "k-gone", `{"item":"book"}`).WithContext(ctx))
		})
		<-effect
		cancel() // the client disconnects
		time.Sleep(lease + lease/2)
		retry := f.post(tenant, "k-gone", `{"item":"book"}`)
		wantProblem(t, retry, http.StatusConflict, claimclient.ProblemInProgress, "k-gone")
		wg.Wait()
		if got := handlerCtxErr.Load(); got != "<nil>" {
			t.Fatalf("the handler's context ended with %v after the client left", got)
		}
		if fl.Renews.Load() < 2 {
			t.Fatalf("renewals = %d, want the lease kept alive", fl.Renews.Load())
		}
		wantOneEffect(t, f, tenant, "k-gone", `{"item":"book"}`, durable.Completed)
	})
}

// Issue path 4, after the effect: a panic marks the record uncertain.
func TestWorkflow_PanicAfterTheEffect(t *testing.T) {
	t.Parallel()
	redisModes(t, func(t *testing.T, withRedis bool) {
		f, _ := setupFlaky(t, withRedis, time.Second)
		tenant := t.Name()
		f.afterEffect(func(*http.Request) { panic("after the charge") })
		func() {
			defer func() {
				if v := recover(); v != "after the charge" {
					t.Fatalf("recovered %v", v)
				}
			}()
			f.post(tenant, "k-boom", `{"item":"book"}`)
		}()
		f.onEffect.Store(nil)
		runs := f.runs.Load()
		w := f.post(tenant, "k-boom", `{"item":"book"}`)
		wantProblem(t, w, http.StatusAccepted, claimclient.ProblemUncertain, "k-boom")
		if f.runs.Load() != runs || f.rows(tenant) != 1 {
			t.Fatalf("runs %d -> %d, rows %d", runs, f.runs.Load(), f.rows(tenant))
		}
	})
}

// Issue path 5: the completion fails for longer than the first cut's three
// quick attempts (~300ms) but within FinishTimeout: the client waits and
// gets the stored result.
func TestWorkflow_CompletionFailsForAMoment(t *testing.T) {
	t.Parallel()
	redisModes(t, func(t *testing.T, withRedis bool) {
		f, fl := setupFlaky(t, withRedis, 5*time.Second, claimhttp.WithFinishTimeout(10*time.Second))
		tenant := t.Name()
		f.afterEffect(func(*http.Request) {
			fl.FinishDown.Store(true)
			time.AfterFunc(time.Second, func() { fl.FinishDown.Store(false) })
		})
		w := f.post(tenant, "k-blip", `{"item":"book"}`)
		if w.Code != http.StatusCreated {
			t.Fatalf("first = %d %s", w.Code, w.Body)
		}
		if fl.Finishes.Load() < 2 {
			t.Fatalf("finishes = %d: the outage was not exercised", fl.Finishes.Load())
		}
		f.onEffect.Store(nil)
		wantOneEffect(t, f, tenant, "k-blip", `{"item":"book"}`, durable.Completed)
	})
}

// The store stays down past FinishTimeout but comes back within the lease:
// the client is told the result is not recorded yet (202, not "not
// processed"), retries wait, and the middleware records the result in the
// background; nothing runs twice.
func TestWorkflow_CompletionOutageLongerThanFinishTimeout(t *testing.T) {
	t.Parallel()
	redisModes(t, func(t *testing.T, withRedis bool) {
		f, fl := setupFlaky(t, withRedis, 5*time.Second, claimhttp.WithFinishTimeout(200*time.Millisecond))
		tenant := t.Name()
		f.afterEffect(func(*http.Request) { fl.FinishDown.Store(true) })
		w := f.post(tenant, "k-long", `{"item":"book"}`)
		p := wantProblem(t, w, http.StatusAccepted, claimclient.ProblemInProgress, "k-long")
		if w.Header().Get("Location") != "/operations/"+p.OperationID {
			t.Fatalf("Location = %q", w.Header().Get("Location"))
		}
		f.onEffect.Store(nil)
		runs := f.runs.Load()
		wantProblem(t, f.post(tenant, "k-long", `{"item":"book"}`), http.StatusConflict, claimclient.ProblemInProgress, "k-long")
		if f.runs.Load() != runs {
			t.Fatal("a retry ran during the outage")
		}
		fl.FinishDown.Store(false)
		// The record turns completed at the background write's commit; the
		// write then caches the result in Redis, and until it has, Redis
		// still answers a retry "in progress". Wait for both.
		deadline := time.Now().Add(10 * time.Second)
		for {
			rec, err := f.record(tenant, "k-long")
			if err == nil && rec.State == durable.Completed {
				if w := f.post(tenant, "k-long", `{"item":"book"}`); w.Code != http.StatusConflict {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("record = %+v, %v; the background completion never landed", rec, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		wantOneEffect(t, f, tenant, "k-long", `{"item":"book"}`, durable.Completed)
	})
}
