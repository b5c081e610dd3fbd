package claimamqp_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// exampleQueue connects to the test server (AMQP_URL or its local
// default) and declares a queue of its own: durable with args (a quorum
// queue), or else auto-deleted. cleanup deletes it and disconnects.
func exampleQueue(durable bool, args amqp.Table) (ch *amqp.Channel, queue string, cleanup func()) {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = testenv.DefaultAMQPURL // amqp://guest:guest@127.0.0.1:5672/
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		log.Fatal(err)
	}
	if ch, err = conn.Channel(); err != nil {
		log.Fatal(err)
	}
	queue = testenv.Name("charges")
	if _, err := ch.QueueDeclare(queue, durable, !durable, false, false, args); err != nil {
		log.Fatal(err)
	}
	return ch, queue, func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		conn.Close()
	}
}

// A worker calling an external system once per message (workflow mode): the
// operation id is that system's idempotency key. The producer published
// one charge twice (its retry after a lost confirm); the worker runs it
// once and acknowledges both deliveries, the second with the stored
// outcome. It runs on the test servers (AMQP_URL, DATABASE_URL, REDIS_URL
// or their local defaults), in a queue and a schema of its own.
func ExampleConsumer_Run() {
	pool, rdb, prefix, cleanup := testenv.Example() // a fresh schema and Redis key prefix on the test servers
	defer cleanup()
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
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
	ch, queue, done := exampleQueue(false, nil) // a queue "charges" in a service
	defer done()
	for range 2 {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: "charge-7f3a", ContentType: "application/json", Body: []byte(`{"amount":1299,"currency":"EUR"}`),
		}); err != nil {
			log.Fatal(err)
		}
	}

	cons, err := claimamqp.New(c, queue)
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	calls := 0
	for range 2 {
		d := <-deliveries
		action, err := cons.Run(ctx, d, func(ctx context.Context, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
			// gateway.Charge(ctx, op.ID, d.Body): a refusal before any
			// effect returns fmt.Errorf("%w: ...", claimamqp.ErrNothingHappened).
			calls++
			return durable.Result{StatusCode: 201, Body: []byte(`{"charge":"ch_1"}`)}, nil
		})
		fmt.Println(d.MessageId, action, err)
	}
	fmt.Println("gateway calls:", calls)
	// Output:
	// charge-7f3a ack <nil>
	// charge-7f3a ack <nil>
	// gateway calls: 1
}

// Deliveries the Consumer gives up on (a reused or missing message-id, or
// a held delivery at the quorum queue's x-delivery-limit) are handed to a
// callback before RabbitMQ drops or dead-letters them; here the queue was
// declared with x-delivery-limit 50, so the Consumer is told. A delivery
// without a message-id cannot be deduplicated: it is given up at once,
// never run. It runs on the test servers, as the example above.
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
	ch, queue, done := exampleQueue(true, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": 50})
	defer done()

	cons, err := claimamqp.New(c, queue,
		claimamqp.WithDeliveryLimit(50),
		claimamqp.WithDeadLetter(func(ctx context.Context, d *amqp.Delivery, err error) {
			// Keep it for an operator: a table, a parking queue, an alert.
			fmt.Printf("delivery %q given up: %v\n", d.Body, err)
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte(`{"amount":1299}`)}); err != nil {
		log.Fatal(err) // no MessageId
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	action, _ := cons.Do(ctx, <-deliveries, func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
		fmt.Println("never runs")
		return durable.Result{}, nil
	})
	fmt.Println(action)
	// Output:
	// delivery "{\"amount\":1299}" given up: consume: message given up (dead-lettered, or dropped without a dead-letter target): consume: message has no identity
	// terminate
}
