package claimnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/settletest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// The entry-point conformance suite against Consumer.Run on a JetStream
// pull consumer. Its top-level tests are not parallel, so no other test of
// the package runs beside them: the negative controls break the
// settlement of the whole process.

func TestConformance(t *testing.T) { entrytest.Run(t, natsDriver{}) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, natsDriver{})
}

const (
	// conformanceAckWait is the consumer's AckWait: the transport's own
	// timer, shorter than the lease, so work outlasts it in several
	// windows and JetStream redelivers the message while it runs.
	conformanceAckWait = time.Second
	// conformanceSendWait bounds how long Send waits for a message to be
	// acknowledged, terminated or held.
	conformanceSendWait = 6 * time.Second
	// conformanceHeader carries the send a delivery belongs to.
	conformanceHeader = "Entrytest-Send"
)

type natsDriver struct{}

func (natsDriver) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "default", Timer: conformanceAckWait, NotApplicable: map[string]string{
		entrytest.CallerGone: "a consumer has no caller to go away: the publisher is done once JetStream stored the message",
		entrytest.Oversized:  "claimnats stores the handler's own durable.Result: it has no result size limit of its own",
	}}
}

// Encode is the handler's own result: a consumer stores what its handler
// returned (a failure through claim.Reject).
func (natsDriver) Encode(r entrytest.Response) durable.Result {
	if r.Kind == entrytest.Failure {
		return durable.Result{StatusCode: http.StatusUnprocessableEntity, Body: r.Body}
	}
	return durable.Result{StatusCode: http.StatusOK, Body: r.Body}
}

func (natsDriver) Start(suite entrytest.Env) entrytest.Adapter {
	t := suite.T
	e := &env{t: t, url: testenv.NATSURL(t)}
	nc := e.dial()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	e.js = js
	e.stream = testenv.Name("S")
	e.subject = e.stream + ".op"
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: e.stream, Subjects: []string{e.subject},
		Duplicates: 100 * time.Millisecond, // Send publishes past it
		Storage:    jetstream.MemoryStorage,
	}); err != nil {
		testenv.Unavailable(t, "NATS JetStream", "NATS_URL", err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), e.stream) })
	cons := e.consumer(nc, conformanceAckWait)
	c, err := claimnats.New(suite.Claimer, claimnats.WithRetryDelay(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	a := &natsAdapter{e: e, suite: suite, c: c, waiting: map[string]chan entrytest.Answer{}}
	ctx, cancel := context.WithCancel(context.Background())
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		a.wg.Add(1)
		go a.handle(ctx, msg)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Stop()
		cancel()
		a.wg.Wait()
	})
	return a
}

type natsAdapter struct {
	e     *env
	suite entrytest.Env
	c     *claimnats.Consumer[pgx.Tx]
	wg    sync.WaitGroup

	pub     sync.Mutex // one publish at a time, each past the deduplication window
	mu      sync.Mutex
	waiting map[string]chan entrytest.Answer // by send
}

// handle runs one delivery through the Consumer, as the application's
// consume loop does, recovering a panic as that loop must (the Consumer
// lets it go on): the delivery is then redelivered after a second.
func (a *natsAdapter) handle(ctx context.Context, msg jetstream.Msg) {
	defer a.wg.Done()
	send := msg.Headers().Get(conformanceHeader)
	ran := false
	defer func() {
		if p := recover(); p != nil {
			_ = msg.NakWithDelay(time.Second)
			a.report(send, entrytest.Answer{Outcome: entrytest.InProgress, Detail: fmt.Sprintf("handler panicked: %v", p)})
		}
	}()
	act, err := a.c.Run(ctx, msg, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
		ran = true
		r := a.suite.Handler(ctx, op.ID, msg.Data())
		switch r.Kind {
		case entrytest.Failure:
			return durable.Result{}, claim.Reject(natsDriver{}.Encode(r))
		case entrytest.Unknown:
			return durable.Result{}, errors.New("downstream outcome unknown")
		}
		return natsDriver{}.Encode(r), nil
	})
	detail := act.String()
	if err != nil {
		detail += ": " + err.Error()
	}
	switch act {
	case claimnats.Ack:
		out := entrytest.Answer{Outcome: entrytest.Replayed, Detail: detail}
		if ran {
			out.Outcome = entrytest.Executed
		}
		// The consumer acknowledges; what it answers is the record's
		// result, the handler's own.
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rec, rerr := a.suite.Record(rctx, durable.Scope{Tenant: "default", Operation: a.e.subject, Key: msg.Headers().Get(nats.MsgIdHdr)})
		cancel()
		res, ok := entrytest.StoredResult(rec)
		if rerr != nil || !ok {
			out.Detail += fmt.Sprintf(" (acknowledged, but the record holds no result: %s %v)", rec.State, rerr)
		}
		out.Result = res
		a.report(send, out)
	case claimnats.Hold:
		a.report(send, entrytest.Answer{Outcome: entrytest.Uncertain, Detail: detail})
	case claimnats.Terminate:
		a.report(send, entrytest.Answer{Outcome: entrytest.Rejected, Detail: detail})
	default: // Retry: redelivered by JetStream
		a.report(send, entrytest.Answer{Outcome: entrytest.InProgress, Detail: detail})
	}
}

func (a *natsAdapter) report(send string, ans entrytest.Answer) {
	a.mu.Lock()
	ch := a.waiting[send]
	a.mu.Unlock()
	if ch == nil {
		return // a redelivery after its Send gave up, or not the suite's
	}
	select {
	case ch <- ans:
	default:
	}
}

func (a *natsAdapter) Send(ctx context.Context, key string, payload []byte) entrytest.Answer {
	var b [8]byte
	_, _ = rand.Read(b[:])
	send := hex.EncodeToString(b[:])
	ch := make(chan entrytest.Answer, 64)
	a.mu.Lock()
	a.waiting[send] = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.waiting, send)
		a.mu.Unlock()
	}()
	msg := nats.NewMsg(a.e.subject)
	msg.Data = payload
	msg.Header.Set(nats.MsgIdHdr, key)
	msg.Header.Set(conformanceHeader, send)
	a.pub.Lock()
	time.Sleep(120 * time.Millisecond) // past JetStream's deduplication window
	_, err := a.e.js.PublishMsg(ctx, msg)
	a.pub.Unlock()
	if err != nil {
		return entrytest.Answer{Outcome: entrytest.Error, Detail: "publish: " + err.Error()}
	}
	last := entrytest.Answer{Outcome: entrytest.InProgress, Detail: "not delivered yet"}
	timeout := time.NewTimer(conformanceSendWait)
	defer timeout.Stop()
	for {
		select {
		case ans := <-ch:
			last = ans
			if ans.Outcome != entrytest.InProgress {
				return ans
			}
		case <-timeout.C:
			last.Detail += " (still not acknowledged, terminated or held)"
			return last
		case <-ctx.Done():
			return entrytest.Answer{Outcome: entrytest.Error, Detail: ctx.Err().Error()}
		}
	}
}
