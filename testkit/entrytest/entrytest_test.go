package entrytest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/entrytest"
)

// noGuard is an "adapter" without any idempotency: every request runs the
// handler and answers its result. The suite must report it.
type noGuard struct{}

func (noGuard) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "t1", NotApplicable: map[string]string{entrytest.Oversized: "no limit"}}
}

func (noGuard) Encode(r entrytest.Response) durable.Result { return durable.Result{Body: r.Body} }

func (noGuard) Start(env entrytest.Env) entrytest.Adapter { return noGuardAdapter{env} }

type noGuardAdapter struct{ env entrytest.Env }

func (a noGuardAdapter) Send(ctx context.Context, _ string, payload []byte) entrytest.Answer {
	r := a.env.Handler(ctx, "op_unguarded", payload)
	return entrytest.Answer{Outcome: entrytest.Executed, Result: entrytest.Result{Failed: r.Kind == entrytest.Failure, Body: r.Body}}
}

// The checker reports what an unguarded entry point does: the same key
// runs again, another payload under it is not refused.
func TestCatch_ReportsAnUnguardedEntryPoint(t *testing.T) {
	vs := entrytest.Catch(t, noGuard{}, entrytest.Mismatch, func() func() { return func() {} })
	var ranAgain, notRefused bool
	for _, v := range vs {
		ranAgain = ranAgain || strings.Contains(v.What, "ran 3 times")
		notRefused = notRefused || strings.Contains(v.What, "want rejected")
	}
	if !ranAgain || !notRefused {
		t.Errorf("violations %v: want the key run three times and the other payload not refused", vs)
	}
}

// withholder is an adapter guarded by the suite's Claimer, right but for
// one thing: it answers every third replay "in progress" instead, as an
// entry point that tells a retry of a finished operation to come back
// later (issue 43). The finished-burst windows must report it.
type withholder struct{}

func (withholder) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "t1", NotApplicable: map[string]string{entrytest.Oversized: "no limit"}}
}

func (withholder) Encode(r entrytest.Response) durable.Result {
	return durable.Result{StatusCode: 200, Body: r.Body}
}

func (withholder) Start(env entrytest.Env) entrytest.Adapter { return &withholderAdapter{env: env} }

type withholderAdapter struct {
	env     entrytest.Env
	replays atomic.Int64
}

func (a *withholderAdapter) Send(ctx context.Context, key string, payload []byte) entrytest.Answer {
	sum := sha256.Sum256(payload)
	out, err := a.env.Claimer.Claim(ctx, claim.Request{
		Scope:       durable.Scope{Tenant: "t1", Operation: "withhold", Key: key},
		Fingerprint: "v1:" + hex.EncodeToString(sum[:]),
	})
	if err != nil {
		return entrytest.Answer{Outcome: entrytest.Error, Detail: err.Error()}
	}
	switch out.Kind {
	case claim.Acquired:
		r := a.env.Handler(ctx, out.OperationID, payload)
		if err := out.Lease.Complete(ctx, withholder{}.Encode(r)); err != nil {
			return entrytest.Answer{Outcome: entrytest.Error, Detail: err.Error()}
		}
		return entrytest.Answer{Outcome: entrytest.Executed, Detail: "executed", Result: entrytest.Result{Body: r.Body}}
	case claim.Replayed:
		if a.replays.Add(1)%3 == 0 {
			return entrytest.Answer{Outcome: entrytest.InProgress, Detail: "the replay withheld"}
		}
		return entrytest.Answer{Outcome: entrytest.Replayed, Detail: "replayed", Result: entrytest.Result{Body: out.Result.Body}}
	case claim.InProgress:
		return entrytest.Answer{Outcome: entrytest.InProgress, Detail: "in progress"}
	}
	return entrytest.Answer{Outcome: entrytest.Error, Detail: out.Kind.String()}
}

// The finished-burst windows report an entry point that tells retries of a
// finished operation it is in progress, with the window and the count, and
// nothing else of an adapter that is right otherwise.
func TestCatch_ReportsAFinishedOperationAnsweredInProgress(t *testing.T) {
	for _, window := range []string{entrytest.BurstTooLarge, entrytest.BurstRedisLost, entrytest.BurstRedisDown} {
		t.Run(window, func(t *testing.T) {
			t.Parallel()
			vs := entrytest.Catch(t, withholder{}, window, func() func() { return func() {} })
			for _, v := range vs {
				if v.Window != window || !strings.Contains(v.What, " of 12 retries of the finished operation were answered in progress") {
					t.Errorf("violation %v: want only retries answered in progress, counted, in window %s", v, window)
				}
			}
		})
	}
}
