package consumetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// DoWork is a Do-mode scenario's handler, in the terms every adapter
// shares: id is the message's identity.
type DoWork func(ctx context.Context, tx pgx.Tx, op claim.Op, id string) (durable.Result, error)

// InsertEffect is the business effect of the Do scenarios: a row of the
// effects table (Schema) in the claim's transaction, naming the message.
func InsertEffect(ctx context.Context, tx pgx.Tx, op claim.Op, id string) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (op_id, msg) VALUES ($1, $2)`, op.ID, id)
	return err
}

// effectWork is the Do scenarios' usual handler: the effect, then a result.
func effectWork(ctx context.Context, tx pgx.Tx, op claim.Op, id string) (durable.Result, error) {
	if err := InsertEffect(ctx, tx, op, id); err != nil {
		return durable.Result{}, err
	}
	return durable.Result{Body: []byte("charged")}, nil
}

// doLease is the Claimers' lease in the Do scenarios, doRetry their
// Consumers' WithRetryDelay.
const (
	doLease = 2 * time.Second
	doRetry = 100 * time.Millisecond
)

// doDuplicatesAndKilledConsumer: the same message published 5 times, the
// consumer of its first delivery killed mid-handler (its connection
// closed, its transaction rolled back, as PostgreSQL aborts a killed
// process's): one effect.
func doDuplicatesAndKilledConsumer(t *testing.T, r Rig) {
	b := r.Base()
	c := Claimer(t, b.Schema, nil, b.Redis, b.Prefix, doLease)
	started := make(chan struct{})
	killA, kill := context.WithCancel(context.Background())
	var once sync.Once
	closeA := r.ConsumeDo(killA, c, doRetry, func(ctx context.Context, tx pgx.Tx, op claim.Op, id string) (durable.Result, error) {
		if err := InsertEffect(ctx, tx, op, id); err != nil {
			return durable.Result{}, err
		}
		once.Do(func() { close(started) })
		<-ctx.Done()
		return durable.Result{}, ctx.Err()
	})
	r.Publish("charge-1", `{"amount":100,"currency":"EUR"}`)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("consumer A never started the handler")
	}
	closeA()
	kill()
	for range 4 {
		r.Publish("charge-1", `{"currency":"EUR", "amount":100}`) // same payload, another member order and spacing
	}
	r.ConsumeDo(context.Background(), c, doRetry, effectWork)
	r.Settled(5, 30*time.Second)
	if rows, distinct := Effects(t, b.Schema); rows != 1 || distinct != 1 {
		t.Fatalf("effects: %d rows for %d messages, want exactly 1", rows, distinct)
	}
}

// doWithoutAdapter is the negative control of the Do scenarios: without
// the adapter the duplicates show as duplicate effects, which the checks
// above catch.
func doWithoutAdapter(t *testing.T, r Rig) {
	b := r.Base()
	for range 3 {
		r.Publish("charge-1", `{"amount":100}`)
	}
	r.ConsumeRaw(func(id string) error {
		_, err := b.Schema.Pool.Exec(context.Background(), `INSERT INTO effects (op_id, msg) VALUES ('', $1)`, id)
		return err
	})
	r.Settled(3, 30*time.Second)
	if rows, distinct := Effects(t, b.Schema); rows != 3 || distinct != 1 {
		t.Fatalf("without the adapter: %d rows for %d messages, want the 3 duplicates", rows, distinct)
	}
}

// doCompetingConsumers: three consumers (each with a Claimer of its own)
// compete for 10 messages each published 3 times: one effect per message.
func doCompetingConsumers(t *testing.T, r Rig) {
	b := r.Base()
	const n = 10
	for i := range n {
		for range 3 {
			r.Publish(fmt.Sprintf("charge-%d", i), fmt.Sprintf(`{"amount":%d}`, i))
		}
	}
	for range 3 {
		r.ConsumeDo(context.Background(), Claimer(t, b.Schema, nil, b.Redis, b.Prefix, doLease), doRetry,
			func(ctx context.Context, tx pgx.Tx, op claim.Op, id string) (durable.Result, error) {
				time.Sleep(20 * time.Millisecond) // widen the race between duplicates
				return effectWork(ctx, tx, op, id)
			})
	}
	r.Settled(3*n, 60*time.Second)
	if rows, distinct := Effects(t, b.Schema); rows != n || distinct != n {
		t.Fatalf("effects: %d rows for %d messages, want %d and %d", rows, distinct, n, n)
	}
}

// doRedisRestartedEmpty: Redis restarted empty between deliveries of the
// same messages; the durable store still arbitrates, one effect per
// message.
func doRedisRestartedEmpty(t *testing.T, r Rig) {
	b := r.Base()
	srv := redisproc.Start(t, redisproc.Options{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	r.ConsumeDo(context.Background(), Claimer(t, b.Schema, nil, rdb, b.Prefix, doLease), doRetry, effectWork)
	for i := range 5 {
		r.Publish(fmt.Sprintf("charge-%d", i), `{"amount":1}`)
	}
	r.Settled(5, 30*time.Second)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r.Publish(fmt.Sprintf("charge-%d", i), `{"amount":1}`)
		r.Publish(fmt.Sprintf("charge-new-%d", i), `{"amount":1}`)
	}
	r.Settled(15, 30*time.Second)
	if rows, distinct := Effects(t, b.Schema); rows != 10 || distinct != 10 {
		t.Fatalf("effects after the Redis restart: %d rows for %d messages, want 10", rows, distinct)
	}
}
