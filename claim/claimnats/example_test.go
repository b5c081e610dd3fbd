package claimnats_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
)

// A worker that charges each message once: the charge is a row written in
// the claim's transaction. (No output: it needs a NATS server.)
func ExampleConsumer_Do() {
	var c *claim.Claimer[pgx.Tx] // claim.New(store, claim.WithRedis(...))
	cons, err := claimnats.New(c, claimnats.WithTenant(func(m jetstream.Msg) string { return m.Headers().Get("Tenant") }))
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	sub, err := js.Consumer(context.Background(), "CHARGES", "charger")
	if err != nil {
		log.Fatal(err)
	}
	_, _ = sub.Consume(func(msg jetstream.Msg) {
		_, _ = cons.Do(context.Background(), msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO charges (op_id, body) VALUES ($1, $2)`, op.ID, msg.Data())
			return durable.Result{StatusCode: 201}, err
		})
	})
}

// Messages the Consumer gives up on (a reused or missing Nats-Msg-Id, or a
// held message at the JetStream consumer's MaxDeliver) are handed to a
// callback before their Term or last nak: JetStream keeps no dead-letter
// copy. The consumer here was created with MaxDeliver 50, so the Consumer
// is told.
func ExampleWithDeadLetter() {
	var c *claim.Claimer[pgx.Tx] // claim.New(store, claim.WithRedis(...))
	cons, err := claimnats.New(c,
		claimnats.WithDeliveryLimit(50),
		claimnats.WithDeadLetter(func(ctx context.Context, msg jetstream.Msg, err error) {
			// Keep it for an operator: a table, another stream, an alert.
			log.Printf("charges: message on %s given up: %v", msg.Subject(), err)
		}))
	if err != nil {
		log.Fatal(err)
	}
	_ = cons
}
