package consume_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/settletest"
)

func newClaimer(t *testing.T) *claim.Claimer[pgx.Tx] {
	t.Helper()
	_, st := settletest.Store(t)
	c, err := claim.New[pgx.Tx](st, claim.WithLease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func msg(id, payload string) consume.Message {
	return consume.Message{ID: id, Tenant: "t", Operation: "charge", Payload: []byte(payload)}
}

func TestDo_ExecutesOnceThenReplays(t *testing.T) {
	c := newClaimer(t)
	ctx := context.Background()
	runs := 0
	fn := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		runs++
		return durable.Result{Body: []byte("ok")}, nil
	}
	for i := range 3 {
		d := consume.Do(ctx, c, msg("m1", `{"a":1,"b":2}`), consume.DefaultDelays, quiet, fn)
		if d.Action != consume.Ack {
			t.Fatalf("delivery %d: %v (%v), want ack", i, d.Action, d.Err)
		}
	}
	// Member order does not change the fingerprint: still a replay.
	if d := consume.Do(ctx, c, msg("m1", `{"b":2, "a":1}`), consume.DefaultDelays, quiet, fn); d.Action != consume.Ack || d.Kind != claim.Replayed {
		t.Fatalf("reordered payload: %+v", d)
	}
	if runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
}

func TestMismatch_TerminatesWithoutRunningOrLoggingTheID(t *testing.T) {
	c := newClaimer(t)
	ctx := context.Background()
	runs := 0
	fn := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		runs++
		return durable.Result{}, nil
	}
	consume.Do(ctx, c, msg("secret-id-42", `{"amount":1}`), consume.DefaultDelays, quiet, fn)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	d := consume.Do(ctx, c, msg("secret-id-42", `{"amount":2}`), consume.DefaultDelays, log, fn)
	if d.Action != consume.Terminate || !errors.Is(d.Err, claim.ErrMismatch) {
		t.Fatalf("got %+v, want terminate with ErrMismatch", d)
	}
	if runs != 1 {
		t.Fatalf("handler ran %d times, want 1 (never for the mismatch)", runs)
	}
	if !strings.Contains(buf.String(), "dead-lettered") || strings.Contains(buf.String(), "secret-id-42") {
		t.Fatalf("log line: %q", buf.String())
	}
	// The workflow path terminates the same way.
	wd := consume.Run(ctx, c, msg("secret-id-42", `{"amount":3}`), consume.DefaultDelays, quiet,
		func(context.Context, claim.Op) (durable.Result, error) { runs++; return durable.Result{}, nil })
	if wd.Action != consume.Terminate || runs != 1 {
		t.Fatalf("workflow mismatch: %+v, runs %d", wd, runs)
	}
}

func TestNoIdentity_Terminates(t *testing.T) {
	c := newClaimer(t)
	d := consume.Run(context.Background(), c, msg("", `{}`), consume.DefaultDelays, quiet,
		func(context.Context, claim.Op) (durable.Result, error) { t.Fatal("ran"); return durable.Result{}, nil })
	if d.Action != consume.Terminate || !errors.Is(d.Err, consume.ErrNoIdentity) {
		t.Fatalf("got %+v", d)
	}
}

func TestDo_TransientErrorRedelivers(t *testing.T) {
	c := newClaimer(t)
	ctx := context.Background()
	boom := errors.New("boom")
	d := consume.Do(ctx, c, msg("m", `1`), consume.DefaultDelays, quiet, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		return durable.Result{}, boom
	})
	if d.Action != consume.Retry || !errors.Is(d.Err, boom) || d.Delay != consume.DefaultDelays.Retry {
		t.Fatalf("got %+v", d)
	}
	// Rolled back: the redelivery runs.
	ran := false
	d = consume.Do(ctx, c, msg("m", `1`), consume.DefaultDelays, quiet, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		ran = true
		return durable.Result{}, nil
	})
	if d.Action != consume.Ack || d.Kind != claim.Executed || !ran {
		t.Fatalf("redelivery: %+v ran=%v", d, ran)
	}
}

func TestRun_Outcomes(t *testing.T) {
	c := newClaimer(t)
	ctx := context.Background()
	ok := func(context.Context, claim.Op) (durable.Result, error) { return durable.Result{Body: []byte("x")}, nil }

	// Nothing happened: released, redelivered, then it runs.
	d := consume.Run(ctx, c, msg("a", `1`), consume.DefaultDelays, quiet, func(context.Context, claim.Op) (durable.Result, error) {
		return durable.Result{}, errors.Join(consume.ErrNothingHappened, errors.New("downstream refused before any effect"))
	})
	if d.Action != consume.Retry {
		t.Fatalf("nothing happened: %+v", d)
	}
	if d = consume.Run(ctx, c, msg("a", `1`), consume.DefaultDelays, quiet, ok); d.Action != consume.Ack || d.Kind != claim.Executed {
		t.Fatalf("after release: %+v", d)
	}

	// Any other error: uncertain, held, and never run again.
	d = consume.Run(ctx, c, msg("b", `1`), consume.DefaultDelays, quiet, func(context.Context, claim.Op) (durable.Result, error) {
		return durable.Result{}, errors.New("timeout after the request was sent")
	})
	if d.Action != consume.Hold || d.Delay != consume.DefaultDelays.Uncertain {
		t.Fatalf("uncertain: %+v", d)
	}
	d = consume.Run(ctx, c, msg("b", `1`), consume.DefaultDelays, quiet, func(context.Context, claim.Op) (durable.Result, error) {
		t.Fatal("an uncertain operation ran again")
		return durable.Result{}, nil
	})
	if d.Action != consume.Hold || d.Kind != claim.Uncertain {
		t.Fatalf("redelivery of uncertain: %+v", d)
	}

	// A business rejection is stored as failed, acked and replayed.
	d = consume.Run(ctx, c, msg("c", `1`), consume.DefaultDelays, quiet, func(context.Context, claim.Op) (durable.Result, error) {
		return durable.Result{}, claim.Reject(durable.Result{StatusCode: 402})
	})
	if d.Action != consume.Ack {
		t.Fatalf("reject: %+v", d)
	}
	d = consume.Run(ctx, c, msg("c", `1`), consume.DefaultDelays, quiet, ok)
	if d.Action != consume.Ack || d.Kind != claim.Replayed {
		t.Fatalf("reject replay: %+v", d)
	}

	// In progress under another consumer: retry after the holder's lease.
	held, err := c.Claim(ctx, claim.Request{Scope: durable.Scope{Tenant: "t", Operation: "charge", Key: "d"}, Fingerprint: consume.Fingerprint([]byte(`1`))})
	if err != nil || held.Kind != claim.Acquired {
		t.Fatalf("claim: %v %v", held.Kind, err)
	}
	d = consume.Run(ctx, c, msg("d", `1`), consume.DefaultDelays, quiet, ok)
	if d.Action != consume.Retry || d.Kind != claim.InProgress || d.Delay < time.Second {
		t.Fatalf("in progress: %+v", d)
	}
}

// A Do handler that panics: its transaction rolled back (nothing happened),
// the panic does not escape, the message is retried, and the redelivery
// runs.
func TestDo_PanicRolledBackRetried(t *testing.T) {
	c := newClaimer(t)
	ctx := context.Background()
	var buf bytes.Buffer
	d := consume.Do(ctx, c, msg("p", `1`), consume.DefaultDelays, slog.New(slog.NewTextHandler(&buf, nil)),
		func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) { panic("handler bug") })
	if d.Action != consume.Retry || !errors.Is(d.Err, consume.ErrPanicked) {
		t.Fatalf("got %+v, want Retry with ErrPanicked", d)
	}
	if !strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "handler bug") {
		t.Fatalf("log: %q", buf.String())
	}
	d = consume.Do(ctx, c, msg("p", `1`), consume.DefaultDelays, quiet, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		return durable.Result{Body: []byte("ok")}, nil
	})
	if d.Action != consume.Ack || d.Kind != claim.Executed {
		t.Fatalf("redelivery: %+v, want executed", d)
	}
}
