package claimamqp_test

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
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/settletest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// The entry-point conformance suite against Consumer.Run on a RabbitMQ
// queue. Its top-level tests are not parallel, so no other test of the
// package runs beside them: the negative controls break the settlement of
// the whole process.

func TestConformance(t *testing.T) { entrytest.Run(t, amqpDriver{}) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, amqpDriver{})
}

const (
	// conformanceSendWait bounds how long Send waits for a message to be
	// acknowledged, dead-lettered or held.
	conformanceSendWait = 6 * time.Second
	// conformanceHeader carries the send a delivery belongs to.
	conformanceHeader = "entrytest-send"
)

type amqpDriver struct{}

func (amqpDriver) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "default", NotApplicable: map[string]string{
		entrytest.CallerGone: "a consumer has no caller to go away: the publisher is done once RabbitMQ took the message",
		entrytest.Oversized:  "claimamqp stores the handler's own durable.Result: it has no result size limit of its own",
	}}
	// Timer stays zero: RabbitMQ's only timer on a delivery is the
	// broker's consumer_timeout (30 minutes by default, checked about once
	// a minute), which no window of a test can outlast; the long-work
	// window outlasts the lease.
}

// Encode is the handler's own result: a consumer stores what its handler
// returned (a failure through claim.Reject).
func (amqpDriver) Encode(r entrytest.Response) durable.Result {
	if r.Kind == entrytest.Failure {
		return durable.Result{StatusCode: http.StatusUnprocessableEntity, Body: r.Body}
	}
	return durable.Result{StatusCode: http.StatusOK, Body: r.Body}
}

func (amqpDriver) Start(suite entrytest.Env) entrytest.Adapter {
	t := suite.T
	e := &env{t: t, url: testenv.AMQPURL(t)}
	e.queue = testenv.Name("q")
	e.dlq = e.queue + ".dead"
	_, e.ch = e.dial()
	if _, err := e.ch.QueueDeclare(e.dlq, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ch.QueueDeclare(e.queue, false, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.dlq,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, c := e.dial()
		_, _ = c.QueueDelete(e.queue, false, false, false)
		_, _ = c.QueueDelete(e.dlq, false, false, false)
	})
	c, err := claimamqp.New(suite.Claimer, e.queue, claimamqp.WithRetryDelay(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	a := &amqpAdapter{e: e, suite: suite, c: c, waiting: map[string]chan entrytest.Answer{}}
	_, ch := e.dial()
	if err := ch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(e.queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range ds {
			a.wg.Add(1)
			go a.handle(ctx, d)
		}
	}()
	t.Cleanup(func() {
		_ = ch.Close() // ends ds; RabbitMQ requeues what was unacknowledged
		<-done
		cancel()
		a.wg.Wait()
	})
	return a
}

type amqpAdapter struct {
	e     *env
	suite entrytest.Env
	c     *claimamqp.Consumer[pgx.Tx]
	wg    sync.WaitGroup

	pub     sync.Mutex // an amqp.Channel publishes one message at a time
	mu      sync.Mutex
	waiting map[string]chan entrytest.Answer // by send
}

// handle runs one delivery through the Consumer, as the application's
// consume loop does, recovering a panic as that loop must: the delivery is
// then requeued after a second.
func (a *amqpAdapter) handle(ctx context.Context, d amqp.Delivery) {
	defer a.wg.Done()
	send, _ := d.Headers[conformanceHeader].(string)
	ran := false
	defer func() {
		if p := recover(); p != nil {
			time.AfterFunc(time.Second, func() { _ = d.Reject(true) })
			a.report(send, entrytest.Answer{Outcome: entrytest.InProgress, Detail: fmt.Sprintf("handler panicked: %v", p)})
		}
	}()
	act, err := a.c.Run(ctx, d, func(ctx context.Context, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
		ran = true
		r := a.suite.Handler(ctx, op.ID, d.Body)
		switch r.Kind {
		case entrytest.Failure:
			return durable.Result{}, claim.Reject(amqpDriver{}.Encode(r))
		case entrytest.Unknown:
			return durable.Result{}, errors.New("downstream outcome unknown")
		}
		return amqpDriver{}.Encode(r), nil
	})
	detail := act.String()
	if err != nil {
		detail += ": " + err.Error()
	}
	switch act {
	case claimamqp.Ack:
		out := entrytest.Answer{Outcome: entrytest.Replayed, Detail: detail}
		if ran {
			out.Outcome = entrytest.Executed
		}
		// The consumer acknowledges; what it answers is the record's
		// result, the handler's own.
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rec, rerr := a.suite.Record(rctx, durable.Scope{Tenant: "default", Operation: a.e.queue, Key: d.MessageId})
		cancel()
		res, ok := entrytest.StoredResult(rec)
		if rerr != nil || !ok {
			out.Detail += fmt.Sprintf(" (acknowledged, but the record holds no result: %s %v)", rec.State, rerr)
		}
		out.Result = res
		a.report(send, out)
	case claimamqp.Hold:
		a.report(send, entrytest.Answer{Outcome: entrytest.Uncertain, Detail: detail})
	case claimamqp.Terminate:
		a.report(send, entrytest.Answer{Outcome: entrytest.Rejected, Detail: detail})
	default: // Retry: requeued by the Consumer after its delay
		a.report(send, entrytest.Answer{Outcome: entrytest.InProgress, Detail: detail})
	}
}

func (a *amqpAdapter) report(send string, ans entrytest.Answer) {
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

func (a *amqpAdapter) Send(ctx context.Context, key string, payload []byte) entrytest.Answer {
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
	a.pub.Lock()
	err := a.e.ch.PublishWithContext(ctx, "", a.e.queue, false, false, amqp.Publishing{
		MessageId: key, ContentType: "application/json", Body: payload,
		Headers: amqp.Table{conformanceHeader: send},
	})
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
			last.Detail += " (still not acknowledged, dead-lettered or held)"
			return last
		case <-ctx.Done():
			return entrytest.Answer{Outcome: entrytest.Error, Detail: ctx.Err().Error()}
		}
	}
}
