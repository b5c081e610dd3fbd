package consumetest

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
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
