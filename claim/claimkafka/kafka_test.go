package claimkafka_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimkafka"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
)

// effectDo is a Do handler inserting the effect row named by the
// record's value.
func effectDo(runs *atomic.Int32) func(ctx context.Context, tx pgx.Tx, rec *kgo.Record, op claim.Op) (durable.Result, error) {
	return func(ctx context.Context, tx pgx.Tx, rec *kgo.Record, op claim.Op) (durable.Result, error) {
		runs.Add(1)
		if err := consumetest.InsertEffect(ctx, tx, op, string(rec.Value)); err != nil {
			return durable.Result{}, err
		}
		return durable.Result{Body: []byte("charged")}, nil
	}
}

// outcomes records Do's and Run's answers by record value.
type outcomes struct {
	mu   sync.Mutex
	acts map[string][]claimkafka.Action
	errs map[string][]error
}

func newOutcomes() *outcomes {
	return &outcomes{acts: map[string][]claimkafka.Action{}, errs: map[string][]error{}}
}

func (o *outcomes) add(rec *kgo.Record, a claimkafka.Action, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.acts[string(rec.Value)] = append(o.acts[string(rec.Value)], a)
	o.errs[string(rec.Value)] = append(o.errs[string(rec.Value)], err)
}

func (o *outcomes) get(v string) ([]claimkafka.Action, []error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]claimkafka.Action(nil), o.acts[v]...), append([]error(nil), o.errs[v]...)
}

// doAll polls with cons in Do mode, recording into o and e.
func (e *env) doAll(cons *claimkafka.Consumer[pgx.Tx], o *outcomes, runs *atomic.Int32) (stop func()) {
	return poll(e.t, context.Background(), cons, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		a, err := cons.Do(ctx, rec, effectDo(runs))
		o.add(rec, a, err)
		if a != claimkafka.Retry {
			e.settle(rec)
		}
		return a, err
	})
}

// waitCommitted waits until the group committed, on every partition that
// has records, the end of it.
func (e *env) waitCommitted(want map[int32]int64) {
	e.t.Helper()
	var got map[int32]int64
	consumetest.WaitUntil(e.t, "the offsets committed", 20*time.Second, func() bool {
		got = e.committed()
		for p, off := range want {
			if got[p] != off {
				return false
			}
		}
		return true
	})
}

func TestNew_ConfigChecked(t *testing.T) {
	e := newEnv(t)
	c := e.claimer(nil, nil, 2*time.Second)
	if _, err := claimkafka.New(c, nil); !errors.Is(err, claimkafka.ErrConfig) {
		t.Errorf("nil client: %v", err)
	}
	if _, err := claimkafka.New(c, e.client(kgo.ConsumeTopics(e.topic))); !errors.Is(err, claimkafka.ErrConfig) {
		t.Errorf("a client in no group: %v", err)
	}
	// A group client that commits what it polled would commit past
	// records not settled: refused.
	if _, err := claimkafka.New(c, e.client(kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(e.topic))); !errors.Is(err, claimkafka.ErrConfig) {
		t.Errorf("a client committing polled offsets: %v", err)
	}
	if _, err := claimkafka.New[pgx.Tx](nil, e.member()); !errors.Is(err, claimkafka.ErrConfig) {
		t.Errorf("nil Claimer: %v", err)
	}
	m := e.member()
	consumetest.CheckOptionsRefused(t, claimkafka.ErrConfig, func(o claimkafka.Option) error { _, err := claimkafka.New(c, m, o); return err },
		nil, claimkafka.WithHeader(""), claimkafka.WithDeadLetterTopic(""), claimkafka.WithIdentity(nil),
		claimkafka.WithOperation(nil), claimkafka.WithTenant(nil), claimkafka.WithLogger(nil), claimkafka.WithRetryDelay(0),
		claimkafka.WithDeadLetter(nil), claimkafka.WithDeliveryLimit(-1), claimkafka.WithMeterProvider(nil))
	if _, err := claimkafka.New(c, m, claimkafka.WithHeader("X-Key"), claimkafka.WithHeaderRequired()); err != nil {
		t.Fatal(err)
	}
}

// The identity is the header: a copy published with the same header is a
// replay. Without the header it is topic/partition/offset: the record
// redelivered (a new group reading the topic again) replays, but the same
// value published again is another record, and runs again.
func TestIdentity_HeaderThenOffset(t *testing.T) {
	e := newEnv(t)
	c := e.claimer(nil, e.rdb, 2*time.Second)
	e.produce("a", claimkafka.DefaultHeader, "charge-a")
	e.produce("a", claimkafka.DefaultHeader, "charge-a")
	e.produce("n") // no header
	e.produce("n") // republished: another offset, another identity
	var runs atomic.Int32
	o := newOutcomes()
	cons, err := claimkafka.New(c, e.member())
	if err != nil {
		t.Fatal(err)
	}
	stop := e.doAll(cons, o, &runs)
	e.Settled(4, 20*time.Second)
	stop()
	if rows, distinct := consumetest.Effects(t, e.schema); rows != 3 || distinct != 2 || runs.Load() != 3 {
		t.Fatalf("effects: %d rows for %d values, %d runs; want a once (the copy replayed) and n twice (republished)", rows, distinct, runs.Load())
	}
	// Redelivered: a new group reads the topic from its start.
	e.group = e.group + "-again"
	e.settled = map[[2]int64]bool{}
	cons2, err := claimkafka.New(c, e.member())
	if err != nil {
		t.Fatal(err)
	}
	e.doAll(cons2, o, &runs)
	e.Settled(4, 20*time.Second)
	if rows, _ := consumetest.Effects(t, e.schema); rows != 3 || runs.Load() != 3 {
		t.Fatalf("after the redelivery: %d rows, %d runs; want every record replayed", rows, runs.Load())
	}
}

// Bad identities are refused before anything is reserved, with a typed
// error, passed on (callback, dead-letter topic, metric by reason, never
// the key) and moved past: no header when required, an empty header, a
// header over 255 bytes.
func TestBadIdentity_RefusedNothingReserved(t *testing.T) {
	e := newTopic(t, 1)
	e.schema = consumetest.Schema(t)
	var logs consumetest.Log
	mp := consumetest.NewCounters()
	var dl consumetest.DeadLetters
	dlt := e.topic + "-dead"
	createTopic(t, e.prod, dlt, 1)
	long := "acct-secret-" + strings.Repeat("x", 300)
	cons, err := claimkafka.New(e.claimer(nil, nil, 2*time.Second), e.member(), claimkafka.WithHeaderRequired(),
		claimkafka.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), claimkafka.WithMeterProvider(mp),
		claimkafka.WithDeadLetterTopic(dlt),
		claimkafka.WithDeadLetter(func(_ context.Context, rec *kgo.Record, err error) { dl.Add(err, string(rec.Value), rec.Offset) }))
	if err != nil {
		t.Fatal(err)
	}
	e.produce("missing")
	e.produce("empty", claimkafka.DefaultHeader, "")
	e.produce("long", claimkafka.DefaultHeader, long)
	e.produce("good", claimkafka.DefaultHeader, "charge-g")
	var runs atomic.Int32
	o := newOutcomes()
	e.doAll(cons, o, &runs)
	e.Settled(4, 20*time.Second)
	for v, want := range map[string]error{"missing": claimkafka.ErrNoIdentity, "empty": claimkafka.ErrNoIdentity, "long": claim.ErrInvalidScope} {
		a, errs := o.get(v)
		if len(a) != 1 || a[0] != claimkafka.Terminate || !errors.Is(errs[0], want) || !errors.Is(errs[0], claimkafka.ErrDeadLetter) {
			t.Errorf("%s: %v %v, want Terminate with %v", v, a, errs, want)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want once (good)", runs.Load())
	}
	var n int
	if err := e.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_requests`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("records: %d (%v), want 1: nothing reserved for a refused record", n, err)
	}
	if errs, _, _ := dl.List(); len(errs) != 3 {
		t.Fatalf("dead-letter callback: %v, want 3 calls", errs)
	}
	if got := mp.Get(consumetest.MetricKey("claimkafka", "no_identity")); got != 2 {
		t.Fatalf("no_identity: %d, want 2 (have %v)", got, mp.Keys())
	}
	if got := mp.Get(consumetest.MetricKey("claimkafka", "invalid_scope")); got != 1 {
		t.Fatalf("invalid_scope: %d, want 1 (have %v)", got, mp.Keys())
	}
	for _, k := range mp.Keys() {
		if strings.Contains(k, "acct-secret") {
			t.Fatalf("a metric names the key: %s", k)
		}
	}
	if out := logs.String(); strings.Contains(out, "acct-secret") || !strings.Contains(out, "offset=") {
		t.Fatalf("log: %q, want the offset and never the key", out)
	}
	copies := e.readTopic(dlt, 3)
	for _, r := range copies {
		if header(r, "oncekey-topic") != e.topic || header(r, "oncekey-offset") == "" {
			t.Fatalf("dead-letter copy %q: headers %v", r.Value, r.Headers)
		}
	}
	if got := header(copies[2], "oncekey-reason"); got != "invalid_scope" {
		t.Fatalf("reason of the long key's copy: %q", got)
	}
	e.waitCommitted(map[int32]int64{0: 4})
}

// readTopic reads n records of topic from its start.
func (e *env) readTopic(topic string, n int) []*kgo.Record {
	e.t.Helper()
	cl := e.client(kgo.ConsumeTopics(topic))
	var recs []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			e.t.Fatalf("read %d records of %s, want %d", len(recs), topic, n)
		}
		recs = append(recs, fs.Records()...)
	}
	return recs
}

// An uncertain record does not hold its partition: passed on (callback,
// dead-letter topic, metric uncertain), marked, and the next record runs.
// Its record stays uncertain; a copy with its identity is answered
// uncertain, never run.
func TestRun_Uncertain_PassedOnPartitionMovesOn(t *testing.T) {
	e := newTopic(t, 1)
	e.schema = consumetest.Schema(t)
	dlt := e.topic + "-dead"
	createTopic(t, e.prod, dlt, 1)
	mp := consumetest.NewCounters()
	var dl consumetest.DeadLetters
	cons, err := claimkafka.New(e.claimer(nil, nil, 2*time.Second), e.member(), claimkafka.WithDeadLetterTopic(dlt), claimkafka.WithMeterProvider(mp),
		claimkafka.WithDeadLetter(func(_ context.Context, rec *kgo.Record, err error) { dl.Add(err, string(rec.Value), rec.Offset) }))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	o := newOutcomes()
	poll(t, context.Background(), cons, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		a, err := cons.Run(ctx, rec, func(context.Context, *kgo.Record, claim.Op) (durable.Result, error) {
			runs.Add(1)
			if string(rec.Value) == "u" {
				return durable.Result{}, errors.New("gateway timed out after the request was sent")
			}
			return durable.Result{Body: []byte("ok")}, nil
		})
		o.add(rec, a, err)
		e.settle(rec)
		return a, err
	})
	e.produce("u", claimkafka.DefaultHeader, "charge-u")
	e.produce("n", claimkafka.DefaultHeader, "charge-n")
	e.Settled(2, 20*time.Second)
	if a, errs := o.get("u"); len(a) != 1 || a[0] != claimkafka.Hold || !errors.Is(errs[0], claimkafka.ErrUncertain) || !errors.Is(errs[0], claimkafka.ErrDeadLetter) {
		t.Fatalf("uncertain record: %v %v, want Hold with ErrUncertain", a, errs)
	}
	if a, errs := o.get("n"); len(a) != 1 || a[0] != claimkafka.Ack {
		t.Fatalf("the record after it: %v %v, want Ack", a, errs)
	}
	if st := recordState(t, e, "u"); st != "uncertain" {
		t.Fatalf("record: %q, want uncertain (for the Reconciler)", st)
	}
	if k := consumetest.MetricKey("claimkafka", "uncertain"); mp.Get(k) != 1 {
		t.Fatalf("metric %s = %d (have %v)", k, mp.Get(k), mp.Keys())
	}
	if errs, payloads, _ := dl.List(); len(errs) != 1 || payloads[0] != "u" {
		t.Fatalf("dead-letter callback: %v %v", errs, payloads)
	}
	if c := e.readTopic(dlt, 1); string(c[0].Value) != "u" || header(c[0], "oncekey-reason") != "uncertain" || header(c[0], claimkafka.DefaultHeader) != "charge-u" {
		t.Fatalf("dead-letter copy: %q %v", c[0].Value, c[0].Headers)
	}
	e.waitCommitted(map[int32]int64{0: 2})
	// A copy with the same identity: answered from the record, not run.
	e.produce("u", claimkafka.DefaultHeader, "charge-u")
	e.Settled(3, 20*time.Second)
	if a, _ := o.get("u"); len(a) != 2 || a[1] != claimkafka.Hold || runs.Load() != 2 {
		t.Fatalf("the copy: %v after %d runs, want Hold and no run", a, runs.Load())
	}
}

// recordState is the state of the test's only record not completed.
func recordState(t *testing.T, e *env, _ string) string {
	t.Helper()
	var s string
	if err := e.schema.Pool.QueryRow(context.Background(),
		`SELECT state::text FROM idempotency_requests WHERE state <> 'completed'`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// The offset committed never passes a record not settled: the consumer
// stopped while a record's Do handler ran (its transaction rolled back)
// commits the record before it, not that one; the next member starts at
// it.
func TestOffsets_CommittedOnlyUpToSettled(t *testing.T) {
	e := newTopic(t, 1)
	e.schema = consumetest.Schema(t)
	c := e.claimer(nil, nil, 2*time.Second)
	e.produce("r0", claimkafka.DefaultHeader, "k0")
	e.produce("r1", claimkafka.DefaultHeader, "k1")
	e.produce("r2", claimkafka.DefaultHeader, "k2")
	clA := e.member()
	consA, err := claimkafka.New(c, clA)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	inR1 := make(chan struct{})
	o := newOutcomes()
	// A's loop without Poll (whose rewind would move the commit position
	// back too): Do alone must not mark r1.
	ctxA, stopA := context.WithCancel(context.Background())
	go func() { <-inR1; stopA() }()
	for handled := 0; handled < 2; {
		fs := clA.PollFetches(context.Background())
		for _, rec := range fs.Records() {
			a, err := consA.Do(ctxA, rec, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record, op claim.Op) (durable.Result, error) {
				if string(rec.Value) == "r1" {
					if err := consumetest.InsertEffect(ctx, tx, op, "r1"); err != nil {
						return durable.Result{}, err
					}
					close(inR1)
					<-ctx.Done() // stopped mid-work: rolled back
					return durable.Result{}, ctx.Err()
				}
				return effectDo(&runs)(ctx, tx, rec, op)
			})
			o.add(rec, a, err)
			if handled++; handled == 2 {
				break
			}
		}
	}
	if err := clA.CommitMarkedOffsets(context.Background()); err != nil { // all that is marked, now
		t.Fatal(err)
	}
	clA.Close()
	if a, _ := o.get("r1"); len(a) != 1 || a[0] != claimkafka.Retry {
		t.Fatalf("r1 stopped mid-work: %v, want Retry", a)
	}
	if got := e.committed()[0]; got != 1 {
		t.Fatalf("committed offset %d, want 1: r0 settled, r1 not", got)
	}
	consB, err := claimkafka.New(c, e.member())
	if err != nil {
		t.Fatal(err)
	}
	e.doAll(consB, o, &runs)
	e.Settled(2, 20*time.Second) // r1 and r2
	if a, _ := o.get("r0"); len(a) != 1 {
		t.Fatalf("r0 handled %d times, want once (committed before B)", len(a))
	}
	if rows, distinct := consumetest.Effects(t, e.schema); rows != 3 || distinct != 3 {
		t.Fatalf("effects: %d rows for %d records, want 3", rows, distinct)
	}
	e.waitCommitted(map[int32]int64{0: 3})
}

// A partition is handled in order: after a record returned unsettled, a
// later record of its partition is refused (not run) until that record
// comes again; and a second record of a partition being handled is
// refused.
func TestOrder_PartitionHeldAtUnsettledRecord(t *testing.T) {
	e := newTopic(t, 1)
	e.schema = consumetest.Schema(t)
	cons, err := claimkafka.New(e.claimer(nil, nil, 2*time.Second), e.member())
	if err != nil {
		t.Fatal(err)
	}
	rec := func(off int64) *kgo.Record {
		return &kgo.Record{Topic: e.topic, Partition: 0, Offset: off, Value: []byte{byte('a' + off)}}
	}
	var runs atomic.Int32
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if a, err := cons.Do(done, rec(5), effectDo(&runs)); a != claimkafka.Retry || err == nil {
		t.Fatalf("ctx ended: %v %v, want Retry", a, err)
	}
	ctx := context.Background()
	if a, err := cons.Do(ctx, rec(6), effectDo(&runs)); a != claimkafka.Retry || !errors.Is(err, claimkafka.ErrOutOfOrder) {
		t.Fatalf("a later record: %v %v, want refused (ErrOutOfOrder)", a, err)
	}
	if runs.Load() != 0 {
		t.Fatalf("ran %d times before the held record came again", runs.Load())
	}
	for _, off := range []int64{5, 6} {
		if a, err := cons.Do(ctx, rec(off), effectDo(&runs)); a != claimkafka.Ack {
			t.Fatalf("offset %d: %v %v, want Ack", off, a, err)
		}
	}
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = cons.Run(ctx, rec(7), func(context.Context, *kgo.Record, claim.Op) (durable.Result, error) {
			close(started)
			<-release
			return durable.Result{}, nil
		})
	}()
	<-started
	if a, err := cons.Do(ctx, rec(8), effectDo(&runs)); a != claimkafka.Retry || !errors.Is(err, claimkafka.ErrOutOfOrder) {
		t.Fatalf("beside a record of its partition: %v %v, want ErrOutOfOrder", a, err)
	}
	close(release)
	consumetest.WaitUntil(t, "offset 8 handled after 7", 10*time.Second, func() bool {
		a, _ := cons.Do(ctx, rec(8), effectDo(&runs))
		return a == claimkafka.Ack
	})
}

// A rebalance during the work: the member handling a record leaves the
// group mid-work; the new owner's delivery of it is answered by the record
// (in progress, then replayed once the first member completes). One run.
func TestRebalance_DuringWork_AnsweredByRecord(t *testing.T) {
	e := newTopic(t, 1)
	e.schema = consumetest.Schema(t)
	c := e.claimer(nil, e.rdb, 2*time.Second)
	e.produce("w", claimkafka.DefaultHeader, "charge-w")
	clA := e.member()
	consA, err := claimkafka.New(c, clA, claimkafka.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	o := newOutcomes()
	work := func(ctx context.Context, rec *kgo.Record, op claim.Op) (durable.Result, error) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		return durable.Result{Body: []byte("done")}, nil
	}
	poll(t, context.Background(), consA, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		a, err := consA.Run(ctx, rec, work)
		o.add(rec, a, err)
		return a, err
	})
	<-started
	clA.LeaveGroup() // the partition is revoked mid-work
	consB, err := claimkafka.New(c, e.member(), claimkafka.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var bRuns atomic.Int32
	poll(t, context.Background(), consB, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		bRuns.Add(1)
		a, err := consB.Run(ctx, rec, work)
		o.add(rec, a, err)
		return a, err
	})
	consumetest.WaitUntil(t, "B handling the record", 20*time.Second, func() bool { return bRuns.Load() > 0 })
	time.Sleep(300 * time.Millisecond) // B answered in progress meanwhile
	close(release)
	consumetest.WaitUntil(t, "both answered", 20*time.Second, func() bool { a, _ := o.get("w"); return len(a) == 2 })
	if a, errs := o.get("w"); a[0] != claimkafka.Ack || a[1] != claimkafka.Ack {
		t.Fatalf("answers: %v %v, want A's Ack and B's replayed Ack", a, errs)
	}
	if runs.Load() != 1 {
		t.Fatalf("ran %d times, want once", runs.Load())
	}
	e.waitCommitted(map[int32]int64{0: 1})
}

// WithDeliveryLimit: a Do handler that panics on every attempt holds its
// partition until the limit, then is given up (ErrDeliveryLimit) and the
// next record runs. Without the limit, the record is handled again and
// again: the partition waits (the control).
func TestDeliveryLimit_PoisonRecordGivenUp(t *testing.T) {
	for _, limit := range []int{3, 0} {
		e := newTopic(t, 1)
		e.schema = consumetest.Schema(t)
		opts := []claimkafka.Option{claimkafka.WithRetryDelay(50 * time.Millisecond)}
		if limit > 0 {
			opts = append(opts, claimkafka.WithDeliveryLimit(limit))
		}
		cons, err := claimkafka.New(e.claimer(nil, nil, 2*time.Second), e.member(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		var attempts, runs atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a, err := cons.Do(ctx, &kgo.Record{Topic: e.topic, Offset: 0, Value: []byte("p")}, func(context.Context, pgx.Tx, *kgo.Record, claim.Op) (durable.Result, error) {
			attempts.Add(1)
			panic("bug")
		})
		cancel()
		if limit > 0 {
			if a != claimkafka.Terminate || !errors.Is(err, claimkafka.ErrDeliveryLimit) || attempts.Load() != 3 {
				t.Fatalf("limit 3: %v %v after %d attempts, want given up after 3", a, err, attempts.Load())
			}
			if a, err := cons.Do(context.Background(), &kgo.Record{Topic: e.topic, Offset: 1, Value: []byte("n")}, effectDo(&runs)); a != claimkafka.Ack {
				t.Fatalf("the next record: %v %v", a, err)
			}
			continue
		}
		if errors.Is(err, claimkafka.ErrDeliveryLimit) || attempts.Load() <= 3 {
			t.Fatalf("no limit: %v after %d attempts, want attempts until ctx ended", err, attempts.Load())
		}
	}
}
