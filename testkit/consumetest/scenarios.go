package consumetest

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
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/settletest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Base is what the scenarios share with an adapter's test: a schema of
// the test's own (migrated, with the effects table: Schema), its Redis and
// its key prefix.
type Base struct {
	Schema testenv.Schema
	Redis  redis.Scripter
	Prefix string
}

// Rig is a consumer adapter's side of the scenarios of this package,
// implemented by the adapter's test env: a queue (a stream) of the test's
// own on the adapter's broker, with a Base of the test's own.
type Rig interface {
	// Base returns the test's schema, Redis and key prefix.
	Base() Base
	// Publish publishes payload under the message identity id. A copy of
	// an id published before is delivered too.
	Publish(id, payload string)
	// ConsumeRun consumes the test's queue with a new Consumer over c,
	// configured by s: each delivery goes through Consumer.Run with work
	// as its handler, and record gets what Run returned. drained waits
	// until the broker has nothing pending or unacknowledged, failing the
	// test after within; stop stops consuming, and may be called again
	// (the test's cleanups call it too).
	ConsumeRun(c *claim.Claimer[pgx.Tx], s Settings, work Work, record func(consume.Action, error)) (drained func(within time.Duration), stop func())
	// ConsumeDo consumes the test's queue on a connection of its own with
	// a new Consumer over c (WithRetryDelay retry): each delivery goes
	// through Consumer.Do under ctx with work as its handler. closeConn
	// closes the connection, as a killed consumer's closes; the test's
	// cleanups close it too.
	ConsumeDo(ctx context.Context, c *claim.Claimer[pgx.Tx], retry time.Duration, work DoWork) (closeConn func())
	// ConsumeRaw consumes the test's queue without the adapter: effect
	// gets each delivery's identity, and the delivery is acknowledged when
	// effect returned nil.
	ConsumeRaw(effect func(id string) error)
	// Settled waits until the test's deliveries are settled, failing the
	// test after within: until n of them (counted across the test's
	// ConsumeDo and ConsumeRaw) were acknowledged or terminated where the
	// broker cannot tell (RabbitMQ: a delayed requeue is an unacknowledged
	// delivery), or until the broker has nothing pending or
	// unacknowledged where it can (JetStream; n unused).
	Settled(n int, within time.Duration)
}

// Scenarios runs, as subtests each on a Rig of its own (newRig), the
// scenarios every consumer adapter runs but StoreOutageAtCompletion,
// which each adapter runs as a test of its own under the name the
// CHANGELOG cites (TestRun_StoreOutageAtCompletion_OneEffect). Not
// parallel: the negative controls break the settlement of the whole
// process. Without -tags oncekey_negative the negative controls of the
// settlement engine fail under CI=true and skip otherwise
// (settletest.NotBuilt).
func Scenarios[R Rig](t *testing.T, newRig func(t *testing.T) R) {
	for _, s := range []struct {
		name string
		run  func(*testing.T, Rig)
	}{
		{"NegativeControl_OneAttempt_StoreOutageAtCompletion_TwoEffects", storeOutageAtCompletionCaught},
		{"Run_PanicAfterEffect_UncertainHeldNoLeak", panicAfterEffectChecked},
		{"NegativeControl_NoRecover_PanicAfterEffect", panicAfterEffectCaught},
		{"Do_DuplicatesAndKilledConsumer_OneEffect", doDuplicatesAndKilledConsumer},
		{"NegativeControl_WithoutAdapter_DuplicateEffects", doWithoutAdapter},
		{"Do_CompetingConsumers_OneEffectEach", doCompetingConsumers},
		{"Do_RedisRestartedEmpty_OneEffect", doRedisRestartedEmpty},
	} {
		t.Run(s.name, func(t *testing.T) { s.run(t, newRig(t)) })
	}
}

// HoldPasser is implemented by the Rig of a broker that passes a held
// message on instead of redelivering it (Kafka: consume.Broker.HoldGivesUp).
// The scenarios that count a held message's redeliveries publish its
// copies instead, which the record must answer the same way: held, never
// run again.
type HoldPasser interface {
	HoldPassesOn()
}

// Settings configure a Rig's Consumer; a zero field is the adapter's
// default.
type Settings struct {
	Retry     time.Duration // WithRetryDelay
	Uncertain time.Duration // WithUncertainDelay
	Log       *slog.Logger  // WithLogger
}

// Options returns the adapter's options for s, given its WithRetryDelay,
// WithUncertainDelay and WithLogger.
func Options[O any](s Settings, retry, uncertain func(time.Duration) O, log func(*slog.Logger) O) []O {
	var opts []O
	if s.Retry > 0 {
		opts = append(opts, retry(s.Retry))
	}
	if s.Uncertain > 0 {
		opts = append(opts, uncertain(s.Uncertain))
	}
	if s.Log != nil {
		opts = append(opts, log(s.Log))
	}
	return opts
}

// Work is a scenario's Run handler, in the terms every adapter shares.
type Work func(ctx context.Context, op claim.Op) (durable.Result, error)

// scenarioLease is the Claimer's lease in the scenarios.
const scenarioLease = 2 * time.Second

// outageAtCompletion is defect 1 of issue 27: lease 2s; the handler does
// its effect, then PostgreSQL is unreachable for 300 ms as the completion
// is written. It returns the effects counted downstream once the message
// was acknowledged, and the consumer's actions.
func outageAtCompletion(t *testing.T, r Rig) (int32, []consume.Action) {
	b := r.Base()
	px, pool := Proxied(t, b.Schema)
	c := Claimer(t, b.Schema, pool, b.Redis, b.Prefix, scenarioLease)
	var effects atomic.Int32 // the downstream's count
	var outages sync.WaitGroup
	var acts Actions
	drained, stop := r.ConsumeRun(c, Settings{Retry: 100 * time.Millisecond}, func(ctx context.Context, op claim.Op) (durable.Result, error) {
		if effects.Add(1) == 1 {
			px.SetDown(true)
			outages.Add(1)
			time.AfterFunc(300*time.Millisecond, func() { px.SetDown(false); outages.Done() })
		}
		return durable.Result{Body: []byte("charged")}, nil
	}, acts.Add)
	defer stop()
	r.Publish("charge-o", `{"amount":7}`)
	WaitUntil(t, "the message acknowledged", 30*time.Second, func() bool { return acts.LastIs(consume.Ack) })
	drained(10 * time.Second)
	outages.Wait()
	a, _ := acts.List()
	return effects.Load(), a
}

// StoreOutageAtCompletion is defect 1 of issue 27: a store outage of
// 300 ms at completion, well inside the lease, does not run the message
// twice: the completion is retried while the lease lasts, and the message
// is acknowledged once it is recorded.
func StoreOutageAtCompletion(t *testing.T, r Rig) {
	n, a := outageAtCompletion(t, r)
	if n != 1 {
		t.Fatalf("effects: %d, want 1 (actions %v)", n, a)
	}
	if len(a) != 1 || a[0] != consume.Ack {
		t.Fatalf("actions: %v, want one Ack (the completion waited out the outage)", a)
	}
}

// storeOutageAtCompletionCaught is the negative control of
// StoreOutageAtCompletion: one completion attempt (the consumer before the
// engine) leaves the record to the redelivery's takeover, which runs the
// effect again. The test must not be parallel: the breakage is the
// process's.
func storeOutageAtCompletionCaught(t *testing.T, r Rig) {
	defer settletest.Break(t, settletest.OneAttempt)()
	if n, a := outageAtCompletion(t, r); n != 2 {
		t.Fatalf("with one completion attempt: %d effects (actions %v), want the 2 StoreOutageAtCompletion catches", n, a)
	}
}

type panicRun struct {
	effects int32
	actions []consume.Action
	errs    []error
	state   string
	leaked  int // lease renewals still running after the deliveries
	logged  string
}

// panicAfterEffect is defect 2 of issue 27: a handler that panics after
// its effect. It waits until the message was delivered 3 times (or 10 s),
// then reports what it saw.
func panicAfterEffect(t *testing.T, r Rig) panicRun {
	var logs Log
	b := r.Base()
	c := Claimer(t, b.Schema, nil, b.Redis, b.Prefix, scenarioLease)
	// A broken settlement (NoRecover) renews its lease for as long as the
	// process lives: fenced when the test ends, so its renewals stop.
	t.Cleanup(func() { FenceHeld(t, b.Schema, scenarioLease) })
	base := KeepAlives()
	var effects atomic.Int32
	var acts Actions
	_, stop := r.ConsumeRun(c, Settings{Retry: 100 * time.Millisecond, Uncertain: 200 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&logs, nil))},
		func(context.Context, claim.Op) (durable.Result, error) {
			effects.Add(1)
			panic("charge-p: gateway client bug after the charge")
		}, acts.Add)
	defer stop()
	r.Publish("charge-p", `{"amount":9}`)
	_, passes := r.(HoldPasser)
	deadline := time.Now().Add(10 * time.Second)
	for published := 1; ; {
		a, _ := acts.List()
		if len(a) >= 3 || time.Now().After(deadline) {
			break
		}
		if passes && len(a) >= published {
			r.Publish("charge-p", `{"amount":9}`) // the redelivery a held message would get
			published++
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	// The renewals of a settled lease end soon after its settlement; poll
	// for that, bounded.
	leaked := KeepAlives() - base
	for end := time.Now().Add(5 * time.Second); leaked > 0 && time.Now().Before(end); leaked = KeepAlives() - base {
		time.Sleep(50 * time.Millisecond)
	}
	res := panicRun{effects: effects.Load(), state: State(t, b.Schema), leaked: leaked, logged: logs.String()}
	res.actions, res.errs = acts.List()
	return res
}

// panicAfterEffectChecked is defect 2 of issue 27: a handler that panics after
// its effect does not crash the consumer, records the operation
// uncertain, holds the message (never acked as a success, never run again
// on its redeliveries), logs the panic at Error, and leaves no lease
// renewal behind.
func panicAfterEffectChecked(t *testing.T, r Rig) {
	res := panicAfterEffect(t, r)
	if res.effects != 1 {
		t.Fatalf("effects: %d, want 1", res.effects)
	}
	if len(res.actions) < 3 {
		t.Fatalf("deliveries: %v, want at least 3 (the held message is redelivered)", res.actions)
	}
	for i, a := range res.actions {
		if a != consume.Hold {
			t.Fatalf("delivery %d: %v (%v), want Hold", i+1, a, res.errs[i])
		}
	}
	if !errors.Is(res.errs[0], consume.ErrPanicked) {
		t.Fatalf("first delivery's error: %v, want ErrPanicked", res.errs[0])
	}
	if res.state != "uncertain" {
		t.Fatalf("record state: %q, want uncertain", res.state)
	}
	if res.leaked != 0 {
		t.Fatalf("%d lease renewals still running after the deliveries", res.leaked)
	}
	if !strings.Contains(res.logged, "level=ERROR") || !strings.Contains(res.logged, "gateway client bug after the charge") {
		t.Fatalf("log: %q, want an Error line with the panic value", res.logged)
	}
}

// panicAfterEffectCaught is the negative control of
// panicAfterEffectChecked:
// without the engine's recover the lease is renewed for as long as the
// process lives: the record stays processing (its redeliveries answered
// in progress, never uncertain) and a renewal goroutine leaks (until the
// test's cleanup fences it). The test must not be parallel.
func panicAfterEffectCaught(t *testing.T, r Rig) {
	defer settletest.Break(t, settletest.NoRecover)()
	res := panicAfterEffect(t, r)
	if res.state == "uncertain" || res.leaked == 0 {
		t.Fatalf("without recover: state %q, %d leaked renewals; want processing and a leak (caught by panicAfterEffectChecked)", res.state, res.leaked)
	}
}
