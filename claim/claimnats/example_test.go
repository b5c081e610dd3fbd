package claimnats_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// exampleStream connects to the test server (NATS_URL or its local
// default) and creates a stream of its own, with JetStream's deduplication
// window as given; cleanup deletes it.
func exampleStream(window time.Duration) (js jetstream.JetStream, stream, subject string, cleanup func()) {
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = testenv.DefaultNATSURL // nats://127.0.0.1:4222
	}
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	if js, err = jetstream.New(nc); err != nil {
		log.Fatal(err)
	}
	stream = testenv.Name("CHARGES")
	subject = stream + ".charge"
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: stream, Subjects: []string{subject}, Storage: jetstream.MemoryStorage, Duplicates: window,
	}); err != nil {
		log.Fatal(err)
	}
	return js, stream, subject, func() {
		_ = js.DeleteStream(context.Background(), stream)
		nc.Close()
	}
}

// A worker that charges each message once: the charge is a row written in
// the claim's transaction. JetStream drops a republished Nats-Msg-Id only
// within its deduplication window (2 minutes by default; 100ms here): the
// producer's retry after it is stored and delivered again, and the
// Consumer acknowledges it with the stored outcome, charging nothing. It
// runs on the test servers (NATS_URL, DATABASE_URL, REDIS_URL or their
// local defaults), in a stream and a schema of its own.
func ExampleConsumer_Do() {
	pool, rdb, prefix, cleanup := testenv.Example() // a fresh schema and Redis key prefix on the test servers
	defer cleanup()
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (op_id text PRIMARY KEY, body bytea NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	store, err := postgres.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	c, err := claim.New[pgx.Tx](store, claim.WithRedis(rdb, lua.Options{Prefix: prefix}))
	if err != nil {
		log.Fatal(err)
	}
	js, stream, subject, done := exampleStream(100 * time.Millisecond)
	defer done()

	// The producer publishes a charge, and once more after JetStream's
	// window (its retry after a lost acknowledgement).
	for stored := 0; stored < 2; {
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte(`{"amount":1299}`),
			Header: nats.Header{"Tenant": {"acme"}}}, jetstream.WithMsgID("charge-7f3a"))
		if err != nil {
			log.Fatal(err)
		}
		if !ack.Duplicate {
			stored++
		}
		time.Sleep(150 * time.Millisecond)
	}

	cons, err := claimnats.New(c, claimnats.WithTenant(func(m jetstream.Msg) string { return m.Headers().Get("Tenant") }))
	if err != nil {
		log.Fatal(err)
	}
	sub, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "charger", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		log.Fatal(err)
	}
	batch, err := sub.Fetch(2, jetstream.FetchMaxWait(5*time.Second)) // a service uses sub.Consume
	if err != nil {
		log.Fatal(err)
	}
	for msg := range batch.Messages() {
		action, err := cons.Do(ctx, msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO charges (op_id, body) VALUES ($1, $2)`, op.ID, msg.Data())
			return durable.Result{StatusCode: 201}, err
		})
		fmt.Println(msg.Headers().Get(jetstream.MsgIDHeader), action, err)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n)
	// Output:
	// charge-7f3a ack <nil>
	// charge-7f3a ack <nil>
	// charges: 1
}

// Messages the Consumer gives up on (a reused or missing Nats-Msg-Id, or a
// held message at the JetStream consumer's MaxDeliver) are handed to a
// callback before their Term or last nak: JetStream keeps no dead-letter
// copy. The consumer here is created with MaxDeliver 50, so the Consumer
// is told. A message without a Nats-Msg-Id cannot be deduplicated: it is
// given up at once, never run. It runs on the test servers, as the example
// above.
func ExampleWithDeadLetter() {
	pool, _, _, cleanup := testenv.Example()
	defer cleanup()
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	store, err := postgres.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	c, err := claim.New[pgx.Tx](store) // claim.WithRedis(...) in a service
	if err != nil {
		log.Fatal(err)
	}
	js, stream, subject, done := exampleStream(0)
	defer done()

	cons, err := claimnats.New(c,
		claimnats.WithDeliveryLimit(50),
		claimnats.WithDeadLetter(func(ctx context.Context, msg jetstream.Msg, err error) {
			// Keep it for an operator: a table, another stream, an alert.
			fmt.Printf("message %q given up: %v\n", msg.Data(), err)
		}))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := js.Publish(ctx, subject, []byte(`{"amount":1299}`)); err != nil { // no Nats-Msg-Id
		log.Fatal(err)
	}
	sub, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "charger", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 50})
	if err != nil {
		log.Fatal(err)
	}
	msg, err := sub.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		log.Fatal(err)
	}
	action, _ := cons.Do(ctx, msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
		fmt.Println("never runs")
		return durable.Result{}, nil
	})
	fmt.Println(action)
	// Output:
	// message "{\"amount\":1299}" given up: consume: message given up (dead-lettered, or dropped without a dead-letter target): consume: message has no identity
	// terminate
}
