package claimnats_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
)

func effectFn(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
	if err := consumetest.InsertEffect(ctx, tx, op, msg.Headers().Get(nats.MsgIdHdr)); err != nil {
		return durable.Result{}, err
	}
	return durable.Result{Body: []byte("charged")}, nil
}

// A reused id with another payload is terminated with a clear log line
// without the raw id, and never run.
func TestMismatch_TerminatedNeverRun(t *testing.T) {
	e := newEnv(t)
	var logs consumetest.Log
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second), claimnats.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	e.Publish("acct-secret-77", `{"amount":1}`)
	e.Publish("acct-secret-77", `{"amount":999}`)
	sub := e.consumer(e.dial(), 2*time.Second)
	var actions sync.Map
	var runs atomic.Int32
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		a, err := cons.Do(context.Background(), msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			runs.Add(1)
			if string(msg.Data()) != `{"amount":1}` {
				t.Errorf("the mismatching payload ran")
			}
			return effectFn(ctx, tx, msg, op)
		})
		actions.Store(string(msg.Data()), [2]any{a, err})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.drained(sub, 30*time.Second)
	got, _ := actions.Load(`{"amount":999}`)
	r, _ := got.([2]any)
	if r[0] != claimnats.Terminate || !errors.Is(r[1].(error), claim.ErrMismatch) {
		t.Fatalf("mismatch: %v", r)
	}
	if out := logs.String(); !strings.Contains(out, "dead-lettered") || strings.Contains(out, "acct-secret-77") {
		t.Fatalf("log: %q", out)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

// Workflow mode: a consumer paused (cut off its database) past its lease is
// fenced when it resumes; the redelivery replays the taker's result.
func TestRun_PausedPastLease_Fenced(t *testing.T) {
	e := newEnv(t)
	px, pausedPool := consumetest.Proxied(t, e.schema) // the paused consumer's way to its database
	cA, err := claimnats.New(e.claimer(pausedPool, nil, time.Second), claimnats.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cB, err := claimnats.New(e.claimer(nil, nil, time.Second), claimnats.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.Publish("charge-p", `{"amount":5}`)
	sub := e.consumer(e.dial(), 30*time.Second)
	msgs, err := sub.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first := <-msgs.Messages()
	if first == nil {
		t.Fatal("no message")
	}
	resume := make(chan struct{})
	var downstream sync.Map // operation id → calls, as an idempotent downstream records them
	calls := func(id string) { v, _ := downstream.LoadOrStore(id, new(atomic.Int32)); v.(*atomic.Int32).Add(1) }
	type res struct {
		a     claimnats.Action
		err   error
		cause error
	}
	done := make(chan res, 1)
	go func() {
		var cause error
		a, err := cA.Run(context.Background(), first, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			px.SetDown(true) // paused: no renewals reach the database
			<-ctx.Done()     // KeepAlive gives up on the lease
			cause = context.Cause(ctx)
			<-resume
			px.SetDown(false)
			calls(op.ID)
			return durable.Result{Body: []byte("A")}, nil
		})
		done <- res{a, err, cause}
	}()
	// B takes over once A's lease expired, and completes.
	var bAction claimnats.Action
	deadline := time.Now().Add(20 * time.Second)
	for bAction != claimnats.Ack {
		if time.Now().After(deadline) {
			t.Fatalf("B never took over: last %v", bAction)
		}
		time.Sleep(300 * time.Millisecond)
		bAction, _ = cB.Run(context.Background(), fakeMsg{first}, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			calls(op.ID)
			return durable.Result{Body: []byte("B")}, nil
		})
	}
	close(resume)
	r := <-done
	if !errors.Is(r.cause, claim.ErrLeaseExpired) {
		t.Fatalf("A's work context cause = %v, want ErrLeaseExpired", r.cause)
	}
	if r.a != claimnats.Retry || !errors.Is(r.err, claim.ErrFenced) {
		t.Fatalf("A after resuming: %v %v, want Retry with ErrFenced", r.a, r.err)
	}
	// Both executions carried the same operation id downstream, so a
	// downstream deduplicating on it absorbs the repeat.
	ids := 0
	downstream.Range(func(_, v any) bool {
		ids++
		if n := v.(*atomic.Int32).Load(); n != 2 {
			t.Errorf("downstream calls under the operation id: %d, want 2 (A and B)", n)
		}
		return true
	})
	if ids != 1 {
		t.Fatalf("downstream saw %d operation ids, want 1", ids)
	}
	// The redelivery is answered with B's stored result, without running.
	a, err := cA.Run(context.Background(), fakeMsg{first}, func(context.Context, jetstream.Msg, claim.Op) (durable.Result, error) {
		t.Fatal("ran after completion")
		return durable.Result{}, nil
	})
	if a != claimnats.Ack || err != nil {
		t.Fatalf("redelivery: %v %v", a, err)
	}
}

// fakeMsg hands the same message to another consumer without acknowledging
// the broker twice: acknowledgements are recorded, not sent.
type fakeMsg struct{ jetstream.Msg }

func (fakeMsg) Ack() error                       { return nil }
func (fakeMsg) NakWithDelay(time.Duration) error { return nil }
func (fakeMsg) Term() error                      { return nil }
