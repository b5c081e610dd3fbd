package claimgrpc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// A completion that cannot be written (the store went down after the
// handler's effect) neither releases the key nor answers "not processed":
// the caller gets Aborted (ReasonPending), retries see the call in
// progress, and once the store is back the interceptor records the reply
// in the background; the retry replays it. One effect.
func TestInterceptor_LostCompletionIsRecordedLater(t *testing.T) {
	t.Parallel()
	fl := &settletest.Flaky{Finishing: settletest.Complete} // the completions fail while down
	f := setup(t, config{
		redis:   true,
		claim:   []claim.Option{claim.WithLease(5 * time.Second)},
		options: []claimgrpc.Option{claimgrpc.WithFinishTimeout(100 * time.Millisecond)},
		wrap:    fl.Wrap,
	})
	hook := func(context.Context, *structpb.Struct) { fl.FinishDown.Store(true) }
	f.onRun.Store(&hook)
	in := map[string]any{"item": "tea"}
	_, st, _ := f.call(t.Context(), f.conn, "acme", "k", in)
	if r, op, _ := reason(st); st.Code() != codes.Aborted || r != claimgrpc.ReasonPending || op == "" {
		t.Fatalf("lost completion: %v, reason %q", st, r)
	}
	_, st, _ = f.call(t.Context(), f.conn, "acme", "k", in)
	if r, _, _ := reason(st); st.Code() != codes.Aborted || r != claimgrpc.ReasonInProgress {
		t.Fatalf("retry while the store is down: %v, reason %q", st, r)
	}
	f.onRun.Store(nil)
	fl.FinishDown.Store(false)
	for {
		reply, st, hdr := f.call(t.Context(), f.conn, "acme", "k", in)
		if r, _, _ := reason(st); st.Code() == codes.Aborted && r == claimgrpc.ReasonInProgress {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if st.Code() != codes.OK || len(hdr.Get(claimgrpc.MetadataReplayed)) != 1 || reply.GetFields()["item"].GetStringValue() != "tea" {
			t.Fatalf("retry after the store came back: %v %v", st, reply)
		}
		break
	}
	if f.effects("tea") != 1 || f.runs.Load() != 1 || fl.Finishes.Load() < 2 {
		t.Fatalf("%d effects, %d runs, %d completion attempts", f.effects("tea"), f.runs.Load(), fl.Finishes.Load())
	}
}

// A handler whose lease could not be renewed is stopped (its context ends
// with ErrLeaseExpired); the error it then returns is not its outcome, so
// the record is marked uncertain rather than stored as a failure to
// replay, and nothing runs again.
func TestInterceptor_InterruptedHandlerIsUncertain(t *testing.T) {
	t.Parallel()
	rd := &settletest.Flaky{} // the renewals fail while down
	f := setup(t, config{
		claim: []claim.Option{claim.WithLease(600 * time.Millisecond)},
		wrap:  rd.Wrap,
	})
	cause := make(chan error, 1)
	hook := func(ctx context.Context, _ *structpb.Struct) {
		rd.RenewDown.Store(true)
		<-ctx.Done() // KeepAlive gives up before the lease ends
		cause <- context.Cause(ctx)
		rd.RenewDown.Store(false)
	}
	f.onRun.Store(&hook)
	in := map[string]any{"item": "clock"}
	_, st, _ := f.call(t.Context(), f.conn, "acme", "k", in)
	if err := <-cause; !errors.Is(err, claim.ErrLeaseExpired) {
		t.Fatalf("handler context ended with %v, want ErrLeaseExpired", err)
	}
	if r, _, _ := reason(st); st.Code() != codes.Aborted || r != claimgrpc.ReasonUncertain {
		t.Fatalf("interrupted handler: %v, reason %q", st, r)
	}
	f.onRun.Store(nil)
	ref, err := f.store.Ref(durable.Scope{Tenant: "acme", Operation: createMethod, Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := f.store.Get(t.Context(), ref); err != nil || rec.State != durable.Uncertain {
		t.Fatalf("record %+v, %v; want uncertain", rec.State, err)
	}
	if _, st, _ := f.call(t.Context(), f.conn, "acme", "k", in); st.Code() != codes.Aborted || f.runs.Load() != 1 {
		t.Fatalf("retry: %v after %d runs", st, f.runs.Load())
	}
}
