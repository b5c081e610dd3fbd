package claimkafka_test

import (
	"context"
	"fmt"
	"log"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimkafka"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// A worker that charges each record once: the charge is a row written in
// the claim's transaction. The producer sends a charge twice with the same
// Idempotency-Key header (its retry after a lost acknowledgement): Kafka
// stores both, and the Consumer answers the copy from the record,
// charging nothing. It runs on an in-process Kafka (kfake) and the test
// servers (DATABASE_URL, REDIS_URL or their local defaults), in a schema of
// its own.
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
	kf, err := kfake.NewCluster(kfake.SeedTopics(1, "charges"))
	if err != nil {
		log.Fatal(err)
	}
	defer kf.Close()

	prod, err := kgo.NewClient(kgo.SeedBrokers(kf.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer prod.Close()
	for range 2 {
		rec := &kgo.Record{Topic: "charges", Value: []byte(`{"amount":100}`),
			Headers: []kgo.RecordHeader{{Key: claimkafka.DefaultHeader, Value: []byte("charge-42")}}}
		if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}

	// The worker: a consumer group member that commits only what it
	// marked (kgo.AutoCommitMarks); the Consumer marks a record once it
	// is settled.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kf.ListenAddrs()...), kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("charges"), kgo.AutoCommitMarks(), kgo.BlockRebalanceOnPoll())
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	cons, err := claimkafka.New(c, cl)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(ctx)
	var handled atomic.Int32
	err = cons.Poll(ctx, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		a, err := cons.Do(ctx, rec, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record, op claim.Op) (durable.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO charges (op_id, body) VALUES ($1, $2)`, op.ID, rec.Value)
			return durable.Result{Body: []byte("charged")}, err
		})
		fmt.Println("offset", rec.Offset, a, err)
		if handled.Add(1) == 2 {
			stop()
		}
		return a, err
	})
	fmt.Println("poll:", err)
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM charges`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// offset 0 ack <nil>
	// offset 1 ack <nil>
	// poll: context canceled
	// charges: 1
}
