package claimamqp_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/durable"
)

// A worker calling an external system once per message (workflow mode): the
// operation id is that system's idempotency key. (No output: it needs a
// RabbitMQ server.)
func ExampleConsumer_Run() {
	var c *claim.Claimer[pgx.Tx] // claim.New(store, claim.WithRedis(...))
	cons, err := claimamqp.New(c, "charges")
	if err != nil {
		log.Fatal(err)
	}
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	ch, _ := conn.Channel()
	deliveries, err := ch.Consume("charges", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for d := range deliveries {
		_, _ = cons.Run(context.Background(), d, func(ctx context.Context, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
			// gateway.Charge(ctx, op.ID, d.Body): a refusal before any
			// effect returns fmt.Errorf("%w: ...", claimamqp.ErrNothingHappened).
			_ = fmt.Sprint(op.ID)
			return durable.Result{StatusCode: 201}, nil
		})
	}
}

// Deliveries the Consumer gives up on (a reused or missing message-id, or
// a held delivery at the quorum queue's x-delivery-limit) are handed to a
// callback before RabbitMQ drops or dead-letters them; here the queue was
// declared with x-delivery-limit 50, so the Consumer is told.
func ExampleWithDeadLetter() {
	var c *claim.Claimer[pgx.Tx] // claim.New(store, claim.WithRedis(...))
	cons, err := claimamqp.New(c, "charges",
		claimamqp.WithDeliveryLimit(50),
		claimamqp.WithDeadLetter(func(ctx context.Context, d *amqp.Delivery, err error) {
			// Keep it for an operator: a table, a parking queue, an alert.
			log.Printf("charges: delivery %d given up: %v", d.DeliveryTag, err)
		}))
	if err != nil {
		log.Fatal(err)
	}
	_ = cons
}
