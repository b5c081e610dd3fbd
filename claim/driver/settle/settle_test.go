package settle_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/testkit/settletest"
)

type fixture struct {
	t     *testing.T
	store storeapi.Store[pgx.Tx]
	fl    *settletest.Flaky // the Claimer's store: every lease write fails while down (SetDown)
	c     *claim.Claimer[pgx.Tx]
	n     atomic.Int64
}

func setup(t *testing.T, lease time.Duration) *fixture {
	t.Helper()
	_, st := settletest.Store(t)
	f := &fixture{t: t, store: st}
	f.fl = &settletest.Flaky{Store: f.store, Finishing: settletest.AllFinishing}
	var err error
	f.c, err = claim.New[pgx.Tx](f.fl, claim.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// claim takes a fresh key and returns its lease and scope.
func (f *fixture) claim() (*claim.Lease, durable.Scope) {
	f.t.Helper()
	sc := durable.Scope{Tenant: "t", Operation: "op", Key: fmt.Sprintf("k%d", f.n.Add(1))}
	out, err := f.c.Claim(f.t.Context(), claim.Request{Scope: sc, Fingerprint: "fp"})
	if err != nil || out.Kind != claim.Acquired {
		f.t.Fatalf("claim = %v, %v", out.Kind, err)
	}
	return out.Lease, sc
}

func (f *fixture) state(sc durable.Scope) durable.State {
	f.t.Helper()
	ref, err := f.store.Ref(sc)
	if err != nil {
		f.t.Fatal(err)
	}
	rec, err := f.store.Get(context.Background(), ref)
	if err != nil {
		f.t.Fatal(err)
	}
	if rec.Released {
		return "released"
	}
	return rec.State
}

var done = durable.Result{StatusCode: 200, Body: []byte("ok"), Version: 1}

// outageAtCompletion runs work that does its effect, then the store is
// unreachable for 300 ms while the engine records the completion.
func outageAtCompletion(f *fixture, e *settle.Engine) (settle.Report, durable.Scope) {
	l, sc := f.claim()
	go func() {
		time.Sleep(300 * time.Millisecond)
		f.fl.SetDown(false)
	}()
	rep := e.Run(context.Background(), l, settle.NewOp(l), func(context.Context) settle.Settlement {
		f.fl.SetDown(true)
		return settle.Settlement{Kind: settle.Complete, Result: done}
	})
	return rep, sc
}

// A short store outage at completion, inside the lease: the engine keeps
// renewing and retrying, and the record ends completed. The broken mode
// that writes once (the consumers' and River's first cut) leaves it
// processing, to be taken over and run again.
func TestRun_OutageAtCompletionIsRetriedWithinTheLease(t *testing.T) {
	f := setup(t, 2*time.Second)
	e := &settle.Engine{Name: "test"}
	rep, sc := outageAtCompletion(f, e)
	if rep.Err != nil || rep.Lost != nil {
		t.Fatalf("report = %+v; want recorded", rep)
	}
	if got := f.state(sc); got != durable.Completed {
		t.Fatalf("state = %s; want completed", got)
	}
	if f.fl.Finishes.Load() < 2 {
		t.Fatalf("finishing writes = %d; the outage was not exercised", f.fl.Finishes.Load())
	}

	t.Run("NegativeControl/OneAttempt", func(t *testing.T) {
		defer settletest.Break(t, settletest.OneAttempt)()
		rep, sc := outageAtCompletion(f, e)
		if !errors.Is(rep.Err, claim.ErrUnavailable) {
			t.Fatalf("broken report = %+v; want the outage's error", rep)
		}
		if got := f.state(sc); got != durable.Processing {
			t.Fatalf("broken state = %s; want processing (left to a takeover)", got)
		}
	})
}

// With a handoff, a write still refused answers ErrPending at once and is
// recorded in the background once the store is back, within the lease.
func TestRun_HandoffGoesOnInTheBackground(t *testing.T) {
	f := setup(t, 3*time.Second)
	e := &settle.Engine{Name: "test", Handoff: 50 * time.Millisecond}
	rep, sc := outageAtCompletion(f, e)
	if !errors.Is(rep.Err, settle.ErrPending) {
		t.Fatalf("report = %+v; want ErrPending", rep)
	}
	e.Wait()
	if got := f.state(sc); got != durable.Completed {
		t.Fatalf("state after the background write = %s; want completed", got)
	}
}

// A store outage longer than the lease: the engine gives up when the lease
// has run out and says so; the record stays processing (never released).
func TestRun_LeaseRanOut(t *testing.T) {
	f := setup(t, 300*time.Millisecond)
	e := &settle.Engine{Name: "test"}
	l, sc := f.claim()
	rep := e.Run(context.Background(), l, settle.NewOp(l), func(context.Context) settle.Settlement {
		f.fl.SetDown(true)
		return settle.Settlement{Kind: settle.Complete, Result: done}
	})
	f.fl.SetDown(false)
	if !errors.Is(rep.Err, settle.ErrLeaseRanOut) {
		t.Fatalf("report = %+v; want ErrLeaseRanOut", rep)
	}
	if got := f.state(sc); got != durable.Processing {
		t.Fatalf("state = %s; want processing", got)
	}
}

// A panic after the effect is recorded as uncertain and goes on; the
// renewals stop. Without the recovery (NoRecover) the record stays
// processing, renewed for as long as the process lives.
func TestRun_PanicIsRecordedUncertain(t *testing.T) {
	f := setup(t, 600*time.Millisecond)
	e := &settle.Engine{Name: "test"}
	run := func() (v any, sc durable.Scope) {
		l, sc := f.claim()
		defer func() { v = recover() }()
		e.Run(context.Background(), l, settle.NewOp(l), func(context.Context) settle.Settlement {
			panic("boom")
		})
		return nil, sc
	}
	v, sc := run()
	if v != "boom" {
		t.Fatalf("recovered %v; want the handler's panic to go on", v)
	}
	if got := f.state(sc); got != durable.Uncertain {
		t.Fatalf("state = %s; want uncertain", got)
	}

	t.Run("NegativeControl/NoRecover", func(t *testing.T) {
		restore := settletest.Break(t, settletest.NoRecover)
		v, sc := run()
		restore()
		if v != "boom" {
			t.Fatalf("recovered %v", v)
		}
		// Past the lease it is still renewed: held, never settled.
		time.Sleep(time.Second)
		if got := f.state(sc); got != durable.Processing {
			t.Fatalf("broken state = %s; want processing", got)
		}
	})
}

// Only the application's word releases: a failed or uncertain outcome is
// recorded as such. The broken mode that releases on error is caught.
func TestRun_ReleaseOnlyOnTheApplicationsWord(t *testing.T) {
	f := setup(t, 2*time.Second)
	e := &settle.Engine{Name: "test"}
	run := func(s settle.Settlement, release, uncertain bool) durable.Scope {
		l, sc := f.claim()
		rep := e.Run(context.Background(), l, settle.NewOp(l), func(ctx context.Context) settle.Settlement {
			if release {
				settle.From(ctx).Release()
			}
			if uncertain {
				settle.From(ctx).MarkUncertain()
			}
			return s
		})
		if rep.Err != nil {
			t.Fatalf("report = %+v", rep)
		}
		return sc
	}
	failed := settle.Settlement{Kind: settle.Fail, Result: durable.Result{StatusCode: 409, Version: 1}}
	cases := []struct {
		name               string
		s                  settle.Settlement
		release, uncertain bool
		want               durable.State
	}{
		{"Fail", failed, false, false, durable.Failed},
		{"Uncertain", settle.Settlement{Kind: settle.Uncertain}, false, false, durable.Uncertain},
		{"ZeroSettlementIsUncertain", settle.Settlement{}, false, false, durable.Uncertain},
		{"Released", failed, true, false, "released"},
		{"UncertainWinsOverRelease", failed, true, true, durable.Uncertain},
	}
	for _, c := range cases {
		if got := f.state(run(c.s, c.release, c.uncertain)); got != c.want {
			t.Errorf("%s: state = %s; want %s", c.name, got, c.want)
		}
	}

	t.Run("NegativeControl/ReleaseOnError", func(t *testing.T) {
		defer settletest.Break(t, settletest.ReleaseOnError)()
		if got := f.state(run(failed, false, false)); got == durable.Failed {
			t.Fatal("broken mode recorded failed; want it released")
		}
	})
}

// The work outlives its caller: cancelling ctx does not end the work's
// context, and the outcome is recorded.
func TestRun_WorkIsDetachedFromTheCaller(t *testing.T) {
	f := setup(t, 2*time.Second)
	e := &settle.Engine{Name: "test"}
	l, sc := f.claim()
	ctx, cancel := context.WithCancel(context.Background())
	rep := e.Run(ctx, l, settle.NewOp(l), func(work context.Context) settle.Settlement {
		cancel()
		if work.Err() != nil {
			return settle.Settlement{Kind: settle.Uncertain}
		}
		return settle.Settlement{Kind: settle.Complete, Result: done}
	})
	if rep.Err != nil || f.state(sc) != durable.Completed {
		t.Fatalf("report = %+v, state %s; want completed", rep, f.state(sc))
	}
}

// A step that turns the operation uncertain (an earlier attempt started it
// and never finished) marks the handler uncertain: a handler that ignores
// the error and answers success does not complete the operation. Outside a
// handler run by the engine, Step runs nothing.
func TestStep_UncertainStepWinsOverTheHandlersAnswer(t *testing.T) {
	t.Parallel()
	f := setup(t, 300*time.Millisecond)
	first, sc := f.claim()
	if _, err := first.Step(t.Context(), "charge", func(context.Context, string) ([]byte, error) {
		return nil, errors.New("charged, then the answer was lost")
	}); err == nil {
		t.Fatal("first attempt's step returned no error")
	}
	var second *claim.Lease
	for deadline := time.Now().Add(10 * time.Second); second == nil; time.Sleep(20 * time.Millisecond) {
		out, err := f.c.Claim(t.Context(), claim.Request{Scope: sc, Fingerprint: "fp"})
		if err == nil && out.Kind == claim.Acquired {
			second = out.Lease
		} else if time.Now().After(deadline) {
			t.Fatalf("no takeover after the first lease: %v, %v", out.Kind, err)
		}
	}
	notGuarded := errors.New("not guarded")
	ran := false
	var stepErr error
	eng := settle.Engine{Name: "test"}
	rep := eng.Run(t.Context(), second, settle.NewOp(second), func(ctx context.Context) settle.Settlement {
		_, stepErr = settle.Step(ctx, notGuarded, "charge", func(context.Context, string) ([]byte, error) { ran = true; return nil, nil })
		return settle.Settlement{Kind: settle.Complete, Result: durable.Result{StatusCode: 200}} // ignores the error
	})
	if !errors.Is(stepErr, claim.ErrStepUncertain) || ran {
		t.Fatalf("Step on resume = %v (ran %v), want ErrStepUncertain and nothing run", stepErr, ran)
	}
	if rep.Settlement.Kind != settle.Uncertain || f.state(sc) != durable.Uncertain {
		t.Fatalf("settled %v, record %v; want uncertain", rep.Settlement.Kind, f.state(sc))
	}
	if _, err := settle.Step(t.Context(), notGuarded, "charge", func(context.Context, string) ([]byte, error) { ran = true; return nil, nil }); err != notGuarded || ran {
		t.Fatalf("Step outside a handler = %v (ran %v), want the not-guarded error", err, ran)
	}
}
