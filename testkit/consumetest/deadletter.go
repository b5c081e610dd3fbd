package consumetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// DeadLetters records the calls of a WithDeadLetter callback. Safe for
// concurrent use.
type DeadLetters struct {
	mu       sync.Mutex
	errs     []error
	payloads []string
	counts   []int64 // the broker's delivery count of each
}

// Add records one call: its error, the message's payload and the broker's
// delivery count of the message (NATS NumDelivered, RabbitMQ
// x-delivery-count).
func (d *DeadLetters) Add(err error, payload string, count int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.errs = append(d.errs, err)
	d.payloads = append(d.payloads, payload)
	d.counts = append(d.counts, count)
}

// List returns the calls recorded, in order.
func (d *DeadLetters) List() (errs []error, payloads []string, counts []int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]error(nil), d.errs...), append([]string(nil), d.payloads...), append([]int64(nil), d.counts...)
}

// The messages of the no-identity-and-mismatch scenario: Publish them in
// this order, under these identities ("" is none).
const (
	ReusedID        = "acct-secret-77"
	FirstPayload    = `{"amount":1}`
	MismatchPayload = `{"amount":999}`
	NoIDPayload     = `{"amount":3}`
)

// CheckGivenUp checks the reports of the no-identity-and-mismatch
// scenario after adapter's Consumer, with dl as its WithDeadLetter and mp
// as its WithMeterProvider, handled the three messages: the callback got
// the mismatch and the message without an identity, each with an error
// matching ErrDeadLetter and its cause; the counter counts them by reason,
// and no attribute names the message id.
func CheckGivenUp(t *testing.T, adapter string, dl *DeadLetters, mp *Counters) {
	t.Helper()
	got, payloads, _ := dl.List()
	if len(got) != 2 {
		t.Fatalf("dead-letter callback: %d calls (%v), want 2", len(got), got)
	}
	for i, err := range got {
		want := claim.ErrMismatch
		if payloads[i] == NoIDPayload {
			want = consume.ErrNoIdentity
		}
		if !errors.Is(err, consume.ErrDeadLetter) || !errors.Is(err, want) {
			t.Fatalf("dead letter %s: %v, want ErrDeadLetter and %v", payloads[i], err, want)
		}
	}
	for _, reason := range []string{"mismatch", "no_identity"} {
		if k := MetricKey(adapter, reason); mp.Get(k) != 1 {
			t.Fatalf("metric %s = %d, want 1 (have %v)", k, mp.Get(k), mp.Keys())
		}
	}
	for _, k := range mp.Keys() {
		if strings.Contains(k, ReusedID) {
			t.Fatalf("a metric names the message id: %s", k)
		}
	}
}

// MetricKey is the Counters key of the dead-letter counter of adapter for
// reason.
func MetricKey(adapter, reason string) string {
	return consume.MetricDeadLettered + "|adapter=" + adapter + "|reason=" + reason
}

// CheckHeld checks a held message's run: the handler ran once, the record
// is uncertain (left for the Reconciler) and every delivery was held.
func CheckHeld(t *testing.T, runs int32, state string, actions []consume.Action) {
	t.Helper()
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
	if state != "uncertain" {
		t.Fatalf("record: %q, want uncertain (left for the Reconciler)", state)
	}
	for i, x := range actions {
		if x != consume.Hold {
			t.Fatalf("delivery %d: %v, want Hold", i+1, x)
		}
	}
}

// CheckReportedAtLimit checks that a held message was delivered
// deliveries times and reported given up once, at its last delivery (the
// broker's delivery count then being count): the callback's error matches
// ErrDeliveryLimit and ErrDeadLetter, and the counter counts it.
func CheckReportedAtLimit(t *testing.T, adapter string, deliveries, wantDeliveries int, count int64, dl *DeadLetters, mp *Counters) {
	t.Helper()
	if deliveries != wantDeliveries {
		t.Fatalf("deliveries: %d, want %d (the broker's delivery limit)", deliveries, wantDeliveries)
	}
	errs, _, counts := dl.List()
	if len(errs) != 1 || !errors.Is(errs[0], consume.ErrDeliveryLimit) || !errors.Is(errs[0], consume.ErrDeadLetter) || counts[0] != count {
		t.Fatalf("dead-letter callback: %v at delivery counts %v, want one ErrDeliveryLimit at %d", errs, counts, count)
	}
	if k := MetricKey(adapter, "delivery_limit"); mp.Get(k) != 1 {
		t.Fatalf("metric %s = %d, want 1 (have %v)", k, mp.Get(k), mp.Keys())
	}
}

// CheckNotReported checks that no message was reported given up.
func CheckNotReported(t *testing.T, dl *DeadLetters, why string) {
	t.Helper()
	if errs, _, _ := dl.List(); len(errs) != 0 {
		t.Fatalf("dead-letter callback %s: %v", why, errs)
	}
}

// DeliveryLimit runs the delivery-limit checks of a held message as
// subtests. held(t, told, h) runs h.Work as the Run handler of every
// delivery (h records what Run returned) on a queue of the test's own
// from which the broker gives a message up after deliveries deliveries
// (the last at its delivery count count), with the adapter's Consumer told
// that limit (told) or left to its default, until the broker gave the
// message up; it returns the test's schema and the Consumer's reports (its
// WithDeadLetter and WithMeterProvider). Each run is checked held
// (CheckHeld). Told, the message is reported given up at its last delivery
// (CheckReportedAtLimit); not told, it is not reported, which shows the
// first check depends on the option, not on a coincidence.
func DeliveryLimit(t *testing.T, adapter string, deliveries int, count int64,
	held func(t *testing.T, told bool, h *Held) (testenv.Schema, *DeadLetters, *Counters)) {
	run := func(t *testing.T, told bool) (int, *DeadLetters, *Counters) {
		var h Held
		schema, dl, mp := held(t, told, &h)
		a, _ := h.List()
		CheckHeld(t, h.runs.Load(), State(t, schema), a)
		return len(a), dl, mp
	}
	t.Run("HeldMessageReportedAtLastDelivery", func(t *testing.T) {
		n, dl, mp := run(t, true)
		CheckReportedAtLimit(t, adapter, n, deliveries, count, dl, mp)
	})
	t.Run("NotTold_NotReported", func(t *testing.T) {
		_, dl, _ := run(t, false)
		CheckNotReported(t, dl, "with the Consumer not told the limit")
	})
}

// Held is a DeliveryLimit run's handler and record: Work, whose outcome
// is always uncertain, and the actions of the deliveries (Add what Run
// returned).
type Held struct {
	Actions
	runs atomic.Int32
}

// Work is the handler: a gateway call that timed out after the request
// was sent (the outcome uncertain). It counts its runs.
func (h *Held) Work(context.Context, claim.Op) (durable.Result, error) {
	h.runs.Add(1)
	return durable.Result{}, errors.New("gateway timed out after the request was sent")
}

// Deliveries returns how many deliveries were recorded.
func (h *Held) Deliveries() int {
	a, _ := h.List()
	return len(a)
}

// HeldOptions returns the options of the Consumer a DeliveryLimit held
// run makes, given the adapter's WithUncertainDelay, WithDeadLetter (a
// callback recording into dl, as deadLetter returns it),
// WithMeterProvider and WithDeliveryLimit, and the reports they fill: an
// uncertain delay of 100 ms, the callback, the counters, and when told the
// broker's limit.
func HeldOptions[O any](told bool, limit int, uncertain func(time.Duration) O, deadLetter func(*DeadLetters) O,
	meter func(metric.MeterProvider) O, deliveryLimit func(int) O) ([]O, *DeadLetters, *Counters) {
	dl, mp := new(DeadLetters), NewCounters()
	opts := []O{uncertain(100 * time.Millisecond), deadLetter(dl), meter(mp)}
	if told {
		opts = append(opts, deliveryLimit(limit))
	}
	return opts, dl, mp
}

// CheckOptionsRefused checks that an adapter's New refuses each of opts
// with an error matching errConfig; newWith(o) is New with o alone.
func CheckOptionsRefused[O any](t *testing.T, errConfig error, newWith func(O) error, opts ...O) {
	t.Helper()
	for i, o := range opts {
		if err := newWith(o); !errors.Is(err, errConfig) {
			t.Errorf("option %d: %v, want %v", i, err, errConfig)
		}
	}
}
