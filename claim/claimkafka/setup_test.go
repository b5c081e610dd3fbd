package claimkafka_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimkafka"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// cluster is the Kafka the tests use: KAFKA_BROKERS (comma-separated)
// when set, else an in-process broker of the test's own (kfake), which
// speaks the Kafka protocol, consumer groups included. kf is nil on a
// real cluster.
type cluster struct {
	addrs []string
	kf    *kfake.Cluster
}

func newCluster(t testing.TB) cluster {
	t.Helper()
	if s := os.Getenv("KAFKA_BROKERS"); s != "" {
		return cluster{addrs: strings.Split(s, ",")}
	}
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	return cluster{addrs: kf.ListenAddrs(), kf: kf}
}

// env is one test's world: its own topic (3 partitions) and consumer
// group on its cluster, its own schema and Redis key prefix.
type env struct {
	t      testing.TB
	cl     cluster
	topic  string
	group  string
	prod   *kgo.Client
	schema testenv.Schema
	rdb    redis.Scripter
	prefix string

	mu        sync.Mutex
	settled   map[[2]int64]bool // partition, offset of the records settled (Rig.Settled)
	producedN int
}

func newEnv(t *testing.T) *env { return newBenchEnv(t) }

// newBenchEnv is newEnv for a test or a benchmark.
func newBenchEnv(t testing.TB) *env {
	t.Helper()
	e := newTopic(t, 3)
	e.schema = consumetest.Schema(t)
	e.rdb, e.prefix = testenv.Redis(t)
	return e
}

// newTopic returns an env with only its cluster, topic and group.
func newTopic(t testing.TB, partitions int32) *env {
	t.Helper()
	e := &env{t: t, cl: newCluster(t), topic: testenv.Name("t"), group: testenv.Name("g"), settled: map[[2]int64]bool{}}
	e.prod = e.client(kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	createTopic(t, e.prod, e.topic, partitions)
	return e
}

// createTopic creates topic with n partitions through cl.
func createTopic(t testing.TB, cl *kgo.Client, topic string, n int32) {
	t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, n, 1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	// On a real cluster (KAFKA_BROKERS) the topic outlives the test
	// unless deleted; kfake goes away with it.
	t.Cleanup(func() {
		del := kmsg.NewPtrDeleteTopicsRequest()
		del.TopicNames = []string{topic}
		dt := kmsg.NewDeleteTopicsRequestTopic()
		dt.Topic = kmsg.StringPtr(topic)
		del.Topics = append(del.Topics, dt)
		_, _ = del.RequestWith(context.Background(), cl)
	})
}

// client returns a client on the env's cluster, closed when the test ends.
func (e *env) client(opts ...kgo.Opt) *kgo.Client {
	e.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.cl.addrs...), kgo.FetchMaxWait(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cl.Close)
	return cl
}

// member returns a client in the env's group consuming its topic, marking
// offsets for commit (as claimkafka.New requires).
func (e *env) member(opts ...kgo.Opt) *kgo.Client {
	return e.client(append([]kgo.Opt{kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(e.topic), kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(200 * time.Millisecond)}, opts...)...)
}

// Base is the test's schema, Redis and prefix (consumetest.Rig.Base).
func (e *env) Base() consumetest.Base {
	return consumetest.Base{Schema: e.schema, Redis: e.rdb, Prefix: e.prefix}
}

// claimer returns a Claimer on the test's schema (through pool, default the
// test's) and Redis, with the given lease.
func (e *env) claimer(pool *pgxpool.Pool, rdb redis.Scripter, lease time.Duration) *claim.Claimer[pgx.Tx] {
	e.t.Helper()
	return consumetest.Claimer(e.t, e.schema, pool, rdb, e.prefix, lease)
}

// produce publishes value with headers (key, value pairs) and returns
// the record as stored.
func (e *env) produce(value string, headers ...string) *kgo.Record {
	e.t.Helper()
	rec := &kgo.Record{Topic: e.topic, Value: []byte(value)}
	for i := 0; i+1 < len(headers); i += 2 {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	if err := e.prod.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.producedN++
	e.mu.Unlock()
	return rec
}

// published returns how many records the test produced.
func (e *env) published() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.producedN
}

// Publish publishes payload under the identity id (consumetest.Rig).
func (e *env) Publish(id, payload string) {
	e.t.Helper()
	if id == "" {
		e.produce(payload)
		return
	}
	e.produce(payload, claimkafka.DefaultHeader, id)
}

// settle records that the record at p/offset is settled.
func (e *env) settle(rec *kgo.Record) {
	e.mu.Lock()
	e.settled[[2]int64{int64(rec.Partition), rec.Offset}] = true
	e.mu.Unlock()
}

func (e *env) settledCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.settled)
}

// Settled waits until n distinct records were settled
// (consumetest.Rig.Settled): each record is counted once, however many
// members handled it.
func (e *env) Settled(n int, within time.Duration) {
	e.t.Helper()
	consumetest.WaitUntil(e.t, "records settled", within, func() bool { return e.settledCount() >= n })
}

// committed returns the group's committed offset of each partition of the
// topic (-1: none).
func (e *env) committed() map[int32]int64 {
	e.t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = e.group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = e.topic
	rt.Partitions = []int32{0, 1, 2}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), e.prod)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int32]int64{}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			out[p.Partition] = p.Offset
		}
	}
	return out
}

// poll runs cons.Poll on a goroutine until the test ends or stop, which
// waits for it.
func poll[TTx any](t testing.TB, ctx context.Context, cons *claimkafka.Consumer[TTx], handle func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cons.Poll(ctx, handle)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}
