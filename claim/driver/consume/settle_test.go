package consume_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// newDownClaimer returns a Claimer with lease whose store's completions
// and renewals fail as unreachable while it is down (SetDown);
// Finishes counts the Complete calls.
func newDownClaimer(t *testing.T, lease time.Duration) (*claim.Claimer[pgx.Tx], *settletest.Flaky) {
	t.Helper()
	_, st := settletest.Store(t)
	ds := &settletest.Flaky{Store: st, Finishing: settletest.Complete}
	c, err := claim.New[pgx.Tx](ds, claim.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	return c, ds
}

// The store unreachable at completion for longer than the lease: Run
// retries the completion until the lease ran out, then retries the message
// (ErrLeaseRanOut), leaving the record processing for the takeover of the
// redelivery, which answers from the record once it is back.
func TestRun_OutageLongerThanLease_RetryAfterLeaseRanOut(t *testing.T) {
	c, ds := newDownClaimer(t, time.Second)
	d := consume.Run(t.Context(), c, msg("m", `1`), consume.DefaultDelays, quiet, func(context.Context, claim.Op) (durable.Result, error) {
		ds.SetDown(true)
		return durable.Result{Body: []byte("x")}, nil
	})
	if d.Action != consume.Retry || !errors.Is(d.Err, settle.ErrLeaseRanOut) {
		t.Fatalf("got %+v, want Retry with ErrLeaseRanOut", d)
	}
	if n := ds.Finishes.Load(); n < 2 {
		t.Fatalf("%d completion attempts, want retries while the lease lasted", n)
	}
	ds.SetDown(false)
	// The redelivery: in progress until the lease ends by the database's
	// clock, then taken over (the record decides, as after a crash).
	var runs atomic.Int32
	deadline := time.Now().Add(10 * time.Second)
	for {
		d = consume.Run(t.Context(), c, msg("m", `1`), consume.DefaultDelays, quiet, func(context.Context, claim.Op) (durable.Result, error) {
			runs.Add(1)
			return durable.Result{Body: []byte("x")}, nil
		})
		if d.Action == consume.Ack || time.Now().After(deadline) {
			break
		}
		if d.Action != consume.Retry || d.Kind != claim.InProgress {
			t.Fatalf("redelivery before the takeover: %+v, want Retry in progress", d)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d.Action != consume.Ack || d.Kind != claim.Executed || runs.Load() != 1 {
		t.Fatalf("redelivery: %+v after %d runs, want the takeover executed once", d, runs.Load())
	}
}

// The store down for a moment at completion: Run waits it out and acks.
func TestRun_ShortOutageAtCompletion_Ack(t *testing.T) {
	c, ds := newDownClaimer(t, 2*time.Second)
	d := consume.Run(t.Context(), c, msg("m", `1`), consume.DefaultDelays, quiet, func(context.Context, claim.Op) (durable.Result, error) {
		ds.SetDown(true)
		time.AfterFunc(200*time.Millisecond, func() { ds.SetDown(false) })
		return durable.Result{Body: []byte("x")}, nil
	})
	if d.Action != consume.Ack || d.Kind != claim.Executed {
		t.Fatalf("got %+v, want Ack", d)
	}
	if n := ds.Finishes.Load(); n < 2 {
		t.Fatalf("%d completion attempts, want the first to have failed", n)
	}
}

func TestDrops_Check(t *testing.T) {
	x, err := consume.NewDrops("test", noop.NewMeterProvider(), 3)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	hold := consume.Decision{Action: consume.Hold, Err: errors.New("uncertain")}
	if d, dead := x.Check(ctx, quiet, nil, hold, false); dead || d.Err != hold.Err {
		t.Fatalf("not last: %+v %v", d, dead)
	}
	d, dead := x.Check(ctx, quiet, nil, hold, true)
	if !dead || !errors.Is(d.Err, consume.ErrDeliveryLimit) || !errors.Is(d.Err, consume.ErrDeadLetter) || !errors.Is(d.Err, hold.Err) || d.Action != consume.Hold {
		t.Fatalf("last: %+v %v", d, dead)
	}
	if d, dead := x.Check(ctx, quiet, nil, consume.Decision{Action: consume.Ack}, true); dead || d.Err != nil {
		t.Fatalf("an ack at the limit: %+v %v", d, dead)
	}
	c := newClaimer(t)
	term := consume.Run(ctx, c, msg("", `1`), consume.DefaultDelays, quiet, func(context.Context, claim.Op) (durable.Result, error) {
		t.Fatal("ran")
		return durable.Result{}, nil
	})
	if d, dead := x.Check(ctx, quiet, nil, term, false); !dead || !errors.Is(d.Err, consume.ErrNoIdentity) || errors.Is(d.Err, consume.ErrDeliveryLimit) {
		t.Fatalf("a termination: %+v %v", d, dead)
	}
}
