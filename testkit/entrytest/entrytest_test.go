package entrytest_test

import (
	"context"
	"strings"
	"testing"

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
