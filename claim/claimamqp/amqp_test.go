package claimamqp_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// env is one test's world: its own queue (with a dead-letter queue), schema
// and Redis key prefix.
type env struct {
	t      *testing.T
	url    string
	queue  string
	dlq    string
	ch     *amqp.Channel
	schema testenv.Schema
	rdb    redis.Scripter
	prefix string
	claim  *claim.Claimer[pgx.Tx]
	finals atomic.Int32 // the deliveries of ConsumeDo and ConsumeRaw acknowledged or dead-lettered
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := newQueue(t)
	e.schema = consumetest.Schema(t)
	e.rdb, e.prefix = testenv.Redis(t)
	e.claim = consumetest.Claimer(t, e.schema, nil, e.rdb, e.prefix, 2*time.Second)
	return e
}

// Base is the test's schema, Redis and prefix (consumetest.Rig.Base).
func (e *env) Base() consumetest.Base {
	return consumetest.Base{Schema: e.schema, Redis: e.rdb, Prefix: e.prefix}
}

// newQueue returns an env with only its queue and the queue's dead-letter
// queue, deleted when the test ends.
func newQueue(t *testing.T) *env {
	t.Helper()
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
	return e
}

func (e *env) dial() (*amqp.Connection, *amqp.Channel) {
	e.t.Helper()
	conn, err := amqp.Dial(e.url)
	if err != nil {
		testenv.Unavailable(e.t, "RabbitMQ", "AMQP_URL", err)
	}
	e.t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	return conn, ch
}

// deliveries consumes the test's queue on ch, acknowledging manually.
func (e *env) deliveries(ch *amqp.Channel) <-chan amqp.Delivery {
	e.t.Helper()
	ds, err := ch.Consume(e.queue, "", false, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return ds
}

func (e *env) Publish(id, body string) {
	e.t.Helper()
	if err := e.ch.PublishWithContext(context.Background(), "", e.queue, false, false, amqp.Publishing{
		MessageId: id, ContentType: "application/json", Body: []byte(body),
	}); err != nil {
		e.t.Fatal(err)
	}
}

func effectFn(ctx context.Context, tx pgx.Tx, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
	if err := consumetest.InsertEffect(ctx, tx, op, d.MessageId); err != nil {
		return durable.Result{}, err
	}
	return durable.Result{Body: []byte("charged")}, nil
}

// consume runs a consumer in Do mode under ctx on its own connection;
// finals counts deliveries that ended acked or dead-lettered.
func (e *env) consume(ctx context.Context, cons *claimamqp.Consumer[pgx.Tx], finals *atomic.Int32,
	fn func(context.Context, pgx.Tx, *amqp.Delivery, claim.Op) (durable.Result, error)) *amqp.Connection {
	e.t.Helper()
	conn, ch := e.dial()
	if err := ch.Qos(20, 0, false); err != nil {
		e.t.Fatal(err)
	}
	ds := e.deliveries(ch)
	go func() {
		for d := range ds {
			a, _ := cons.Do(ctx, d, fn)
			if a == claimamqp.Ack || a == claimamqp.Terminate {
				finals.Add(1)
			}
		}
	}()
	return conn
}

func newConsumer(t *testing.T, e *env, opts ...claimamqp.Option) *claimamqp.Consumer[pgx.Tx] {
	t.Helper()
	cons, err := claimamqp.New(e.claim, e.queue, append([]claimamqp.Option{claimamqp.WithRetryDelay(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// A reused message-id with another body is dead-lettered (it lands in the
// queue's dead-letter queue), logged without the id, and never run.
func TestMismatch_DeadLetteredNeverRun(t *testing.T) {
	e := newEnv(t)
	var logs consumetest.Log
	cons := newConsumer(t, e, claimamqp.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	e.Publish("acct-secret-77", `{"amount":1}`)
	e.Publish("acct-secret-77", `{"amount":999}`)
	e.Publish("", `{"amount":3}`) // no identity: dead-lettered too
	var finals, runs atomic.Int32
	e.consume(context.Background(), cons, &finals, func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
		runs.Add(1)
		if string(d.Body) != `{"amount":1}` {
			t.Errorf("ran %s", d.Body)
		}
		return effectFn(ctx, tx, d, op)
	})
	consumetest.WaitUntil(t, "3 deliveries settled", 30*time.Second, func() bool { return finals.Load() == 3 })
	var dead []string
	consumetest.WaitUntil(t, "2 dead letters", 10*time.Second, func() bool {
		d, ok, err := e.ch.Get(e.dlq, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			dead = append(dead, string(d.Body))
		}
		return len(dead) == 2
	})
	if strings.Join(dead, " ") != `{"amount":999} {"amount":3}` {
		t.Fatalf("dead letters: %q", dead)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	if out := logs.String(); !strings.Contains(out, "dead-lettered") || strings.Contains(out, "acct-secret-77") {
		t.Fatalf("log: %q", out)
	}
}

// Workflow mode: an uncertain outcome is not acked; the delivery is held and
// requeued, and is never run again.
func TestRun_UncertainHeldAndRequeued(t *testing.T) {
	e := newEnv(t)
	cons := newConsumer(t, e, claimamqp.WithUncertainDelay(200*time.Millisecond))
	e.Publish("charge-u", `{"amount":1}`)
	_, ch := e.dial()
	ds := e.deliveries(ch)
	var runs int
	fn := func(context.Context, *amqp.Delivery, claim.Op) (durable.Result, error) {
		runs++
		return durable.Result{}, errors.New("gateway timed out after the request was sent")
	}
	a, err := cons.Run(context.Background(), <-ds, fn)
	if a != claimamqp.Hold || err == nil {
		t.Fatalf("first delivery: %v %v, want Hold", a, err)
	}
	select {
	case d := <-ds:
		if !d.Redelivered {
			t.Fatal("the held delivery came back not marked redelivered")
		}
		if a, _ := cons.Run(context.Background(), d, fn); a != claimamqp.Hold {
			t.Fatalf("redelivery: %v, want Hold", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the uncertain delivery was not requeued")
	}
	if runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
}
