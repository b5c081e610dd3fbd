package claimnats_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
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
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := newStream(t, "charge")
	e.schema = consumetest.Schema(t)
	e.rdb, e.prefix = testenv.Redis(t)
	return e
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

// publish publishes payload under id (Nats-Msg-Id), past JetStream's own
// deduplication window so every copy is stored: the server forgets an id
// on a timer some time after the window, so a copy it still calls a
// duplicate is published again.
func (e *env) publish(id, payload string) {
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

// effects counts the effect rows and their distinct messages.
func (e *env) effects() (rows, distinct int) {
	e.t.Helper()
	return consumetest.Effects(e.t, e.schema)
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

// insertEffect is the business effect of the Do tests: a row in the claim's
// transaction.
func insertEffect(ctx context.Context, tx pgx.Tx, op claim.Op, msg jetstream.Msg) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (op_id, msg) VALUES ($1, $2)`, op.ID, msg.Headers().Get(nats.MsgIdHdr))
	return err
}

// freezer is a TCP proxy to PostgreSQL that can cut a process off its
// database, as a paused process is: while frozen, every connection is
// closed and new ones are refused.
type freezer struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	frozen bool
	conns  map[net.Conn]struct{}
}

func newFreezer(t *testing.T, target string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); f.freeze(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			if f.frozen {
				f.mu.Unlock()
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				f.mu.Unlock()
				c.Close()
				continue
			}
			f.conns[c], f.conns[s] = struct{}{}, struct{}{}
			f.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close(); c.Close() }()
			go func() { _, _ = io.Copy(c, s); s.Close(); c.Close() }()
		}
	}()
	return f
}

func (f *freezer) freeze(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frozen = on
	if on {
		for c := range f.conns {
			c.Close()
		}
		f.conns = map[net.Conn]struct{}{}
	}
}

// pool connects through the freezer to the test's schema.
func (f *freezer) pool(t *testing.T, base string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(f.ln.Addr().String())
	cfg.ConnConfig.Host = host
	fmt.Sscan(port, &cfg.ConnConfig.Port)
	cfg.ConnConfig.ConnectTimeout = time.Second
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
