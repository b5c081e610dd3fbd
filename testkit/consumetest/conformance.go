package consumetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/entrytest"
)

// Driver is a consumer adapter's entrytest.Driver: what the conformance
// suite asks of every consumer (its capabilities, Encode, the Sends and
// the consume loop that runs each delivery on a goroutine of its own), with
// the adapter's broker in Consume.
type Driver struct {
	// Adapter is the adapter's package ("claimnats").
	Adapter string
	// Stored is the moment a publisher is done, for the note on
	// entrytest.CallerGone ("JetStream stored the message").
	Stored string
	// Timer is the transport's own timer on a delivery (entrytest.Caps).
	Timer time.Duration
	// Final names a message's final answers ("acknowledged, terminated or
	// held"), as NewSends does.
	Final string
	// Consume starts the adapter over suite.Claimer (WithRetryDelay
	// ConformanceRetry) on a queue (a stream) of the test's own, and
	// hands each delivery to deliver, from the goroutine the broker
	// delivers on. publish is NewSends'; stop ends the deliveries (no
	// deliver call after it returned).
	Consume func(suite entrytest.Env, deliver func(Delivery)) (publish func(ctx context.Context, key, send string, payload []byte) error, stop func())
}

// Delivery is one delivery in a Driver's terms.
type Delivery struct {
	// Send is the send the delivery belongs to (the header Sends' publish
	// set), and Scope its record's.
	Send  string
	Scope durable.Scope
	// Requeue redelivers it after a second (its handler panicked).
	Requeue func()
	// Run runs it through the adapter's Consumer.Run with a handler
	// calling h with its payload.
	Run func(ctx context.Context, h Handler) (consume.Action, error)
}

const (
	// ConformanceRetry is the Consumer's WithRetryDelay under the suite.
	ConformanceRetry = 300 * time.Millisecond
	// conformanceSendWait bounds how long Send waits for a final answer.
	conformanceSendWait = 6 * time.Second
)

// Caps is entrytest.Driver.Caps: tenant "default", the adapter's timer, no
// caller to go away and no result size limit.
func (d Driver) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "default", Timer: d.Timer, NotApplicable: map[string]string{
		entrytest.CallerGone: "a consumer has no caller to go away: the publisher is done once " + d.Stored,
		entrytest.Oversized:  d.Adapter + " stores the handler's own durable.Result: it has no result size limit of its own",
	}}
}

// Encode is entrytest.Driver.Encode (the package function Encode).
func (Driver) Encode(r entrytest.Response) durable.Result { return Encode(r) }

// Start is entrytest.Driver.Start: Consume, with each delivery run as the
// application's consume loop does, through Sends.Deliver on a goroutine of
// its own. t's cleanups stop consuming, then end the runs' context and
// wait for them.
func (d Driver) Start(suite entrytest.Env) entrytest.Adapter {
	var publish func(ctx context.Context, key, send string, payload []byte) error
	sends := NewSends(suite, conformanceSendWait, d.Final, func(ctx context.Context, key, send string, payload []byte) error {
		return publish(ctx, key, send, payload)
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	publish, stop := d.Consume(suite, func(dl Delivery) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sends.Deliver(dl.Send, dl.Scope, dl.Requeue, func(h Handler) (consume.Action, error) { return dl.Run(ctx, h) })
		}()
	})
	suite.T.Cleanup(func() {
		stop()
		cancel()
		wg.Wait()
	})
	return sends
}

// Encode is a consumer's entrytest Driver.Encode: a consumer stores its
// handler's own result, a failure through claim.Reject.
func Encode(r entrytest.Response) durable.Result {
	if r.Kind == entrytest.Failure {
		return durable.Result{StatusCode: http.StatusUnprocessableEntity, Body: r.Body}
	}
	return durable.Result{StatusCode: http.StatusOK, Body: r.Body}
}

// Handler is the suite's handler in a consumer's terms, for Deliver's run
// to call from the adapter's Run handler with the delivery's payload.
type Handler func(ctx context.Context, op claim.Op, payload []byte) (durable.Result, error)

// Sends is the client side (entrytest.Adapter) of a consumer adapter under
// the conformance suite: Send publishes one message carrying the send's
// own id, and waits for what Deliver reports of its deliveries.
type Sends struct {
	suite   entrytest.Env
	publish func(ctx context.Context, key, send string, payload []byte) error
	wait    time.Duration
	final   string

	mu      sync.Mutex
	waiting map[string]chan entrytest.Answer // by send
}

// NewSends returns the Sends of the suite's env. publish publishes payload
// under the message identity key, with send in a header the deliveries
// carry back to Deliver. A Send waits up to wait for a final answer; final
// names it in the answer after that ("acknowledged, terminated or held").
func NewSends(suite entrytest.Env, wait time.Duration, final string,
	publish func(ctx context.Context, key, send string, payload []byte) error) *Sends {
	return &Sends{suite: suite, publish: publish, wait: wait, final: final, waiting: map[string]chan entrytest.Answer{}}
}

// Deliver runs one delivery of send through run, the adapter's
// Consumer.Run with a handler calling h, as the application's consume loop
// does, and reports the answer to the Send waiting for it. scope is the
// delivery's, whose record an acknowledgement answers with. A panic is
// recovered as that loop must (the Consumer lets a handler's go on): it
// calls requeue, which redelivers the delivery after a second.
func (s *Sends) Deliver(send string, scope durable.Scope, requeue func(), run func(h Handler) (consume.Action, error)) {
	ran := false
	defer func() {
		if p := recover(); p != nil {
			requeue()
			s.report(send, entrytest.Answer{Outcome: entrytest.InProgress, Detail: fmt.Sprintf("handler panicked: %v", p)})
		}
	}()
	act, err := run(func(ctx context.Context, op claim.Op, payload []byte) (durable.Result, error) {
		ran = true
		r := s.suite.Handler(ctx, op.ID, payload)
		switch r.Kind {
		case entrytest.Failure:
			return durable.Result{}, claim.Reject(Encode(r))
		case entrytest.Unknown:
			return durable.Result{}, errors.New("downstream outcome unknown")
		}
		return Encode(r), nil
	})
	detail := act.String()
	if err != nil {
		detail += ": " + err.Error()
	}
	switch act {
	case consume.Ack:
		out := entrytest.Answer{Outcome: entrytest.Replayed, Detail: detail}
		if ran {
			out.Outcome = entrytest.Executed
		}
		// The consumer acknowledges; what it answers is the record's
		// result, the handler's own.
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rec, rerr := s.suite.Record(rctx, scope)
		cancel()
		res, ok := entrytest.StoredResult(rec)
		if rerr != nil || !ok {
			out.Detail += fmt.Sprintf(" (acknowledged, but the record holds no result: %s %v)", rec.State, rerr)
		}
		out.Result = res
		s.report(send, out)
	case consume.Hold:
		s.report(send, entrytest.Answer{Outcome: entrytest.Uncertain, Detail: detail})
	case consume.Terminate:
		s.report(send, entrytest.Answer{Outcome: entrytest.Rejected, Detail: detail})
	default: // Retry: redelivered by the broker, or requeued by the Consumer after its delay
		s.report(send, entrytest.Answer{Outcome: entrytest.InProgress, Detail: detail})
	}
}

func (s *Sends) report(send string, ans entrytest.Answer) {
	s.mu.Lock()
	ch := s.waiting[send]
	s.mu.Unlock()
	if ch == nil {
		return // a redelivery after its Send gave up, or not the suite's
	}
	select {
	case ch <- ans:
	default:
	}
}

// Send publishes one message and returns the first final answer of its
// deliveries, or the last one after the wait.
func (s *Sends) Send(ctx context.Context, key string, payload []byte) entrytest.Answer {
	var b [8]byte
	_, _ = rand.Read(b[:])
	send := hex.EncodeToString(b[:])
	ch := make(chan entrytest.Answer, 64)
	s.mu.Lock()
	s.waiting[send] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.waiting, send)
		s.mu.Unlock()
	}()
	if err := s.publish(ctx, key, send, payload); err != nil {
		return entrytest.Answer{Outcome: entrytest.Error, Detail: "publish: " + err.Error()}
	}
	last := entrytest.Answer{Outcome: entrytest.InProgress, Detail: "not delivered yet"}
	timeout := time.NewTimer(s.wait)
	defer timeout.Stop()
	for {
		select {
		case ans := <-ch:
			last = ans
			if ans.Outcome != entrytest.InProgress {
				return ans
			}
		case <-timeout.C:
			last.Detail += " (still not " + s.final + ")"
			return last
		case <-ctx.Done():
			return entrytest.Answer{Outcome: entrytest.Error, Detail: ctx.Err().Error()}
		}
	}
}
