package claimnats_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// env is one test's world: its own stream, schema and Redis key prefix.
type env struct {
	t       *testing.T
	url     string
	js      jetstream.JetStream
	stream  string
	subject string
	schema  testenv.Schema
	rdb     redis.Scripter
	prefix  string
	sub     jetstream.Consumer // the last bound by consume
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := newStream(t, "charge")
	e.schema = consumetest.Schema(t)
	e.rdb, e.prefix = testenv.Redis(t)
	return e
}

// Base is the test's schema, Redis and prefix (consumetest.Rig.Base).
func (e *env) Base() consumetest.Base {
	return consumetest.Base{Schema: e.schema, Redis: e.rdb, Prefix: e.prefix}
}

// newStream returns an env with only its stream, of subject
// "<stream>.<subject>", deleted when the test ends.
func newStream(t *testing.T, subject string) *env {
	t.Helper()
	e := &env{t: t, url: testenv.NATSURL(t)}
	js, err := jetstream.New(e.dial())
	if err != nil {
		t.Fatal(err)
	}
	e.js = js
	e.stream = testenv.Name("S")
	e.subject = e.stream + "." + subject
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: e.stream, Subjects: []string{e.subject},
		// JetStream's own deduplication window is short on purpose here:
		// duplicates published after it reach the consumers, as they do
		// in production after the window (2 minutes by default).
		Duplicates: 100 * time.Millisecond,
		Storage:    jetstream.MemoryStorage,
	}); err != nil {
		testenv.Unavailable(t, "NATS JetStream", "NATS_URL", err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), e.stream) })
	return e
}

func (e *env) dial() *nats.Conn {
	e.t.Helper()
	nc, err := nats.Connect(e.url, nats.Timeout(5*time.Second))
	if err != nil {
		testenv.Unavailable(e.t, "NATS", "NATS_URL", err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

// claimer returns a Claimer on the test's schema (through pool, default the
// test's) and Redis, with the given lease.
func (e *env) claimer(pool *pgxpool.Pool, rdb redis.Scripter, lease time.Duration) *claim.Claimer[pgx.Tx] {
	e.t.Helper()
	return consumetest.Claimer(e.t, e.schema, pool, rdb, e.prefix, lease)
}

// Publish publishes payload under id (Nats-Msg-Id), past JetStream's own
// deduplication window so every copy is stored: the server forgets an id
// on a timer some time after the window, so a copy it still calls a
// duplicate is published again.
func (e *env) Publish(id, payload string) {
	e.t.Helper()
	for range 50 {
		time.Sleep(120 * time.Millisecond)
		ack, err := e.js.Publish(context.Background(), e.subject, []byte(payload), jetstream.WithMsgID(id))
		if err != nil {
			e.t.Fatal(err)
		}
		if !ack.Duplicate {
			return
		}
	}
	e.t.Fatal("JetStream kept calling the message a duplicate after 6s")
}

// consumer makes (or binds to) the durable pull consumer "w" on conn nc.
func (e *env) consumer(nc *nats.Conn, ackWait time.Duration) jetstream.Consumer {
	e.t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := js.CreateOrUpdateConsumer(context.Background(), e.stream, jetstream.ConsumerConfig{
		Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// drained waits until the consumer has nothing pending or unacknowledged.
func (e *env) drained(c jetstream.Consumer, within time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		info, err := c.Info(context.Background())
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("consumer not drained after %v: %+v %v", within, info, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
