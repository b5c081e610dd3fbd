package consume_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/settletest"
)

type testMsg struct{ id string }

func newTestConsumer(t *testing.T, holdGivesUp bool, settled *[]consume.Decision, dead *[]error, mp *consumetest.Counters) *consume.Consumer[pgx.Tx, testMsg] {
	t.Helper()
	cfg := consume.NewConfig(func(m testMsg) string { return m.id }, func(testMsg) string { return "charge" }, func(testMsg) string { return "t" })
	cfg.Meter = mp
	cfg.DeadLetter = func(_ context.Context, _ testMsg, err error) { *dead = append(*dead, err) }
	type options struct{ consume.Config[testMsg] }
	o := options{cfg}
	_, st := settletest.Store(t)
	c, err := claim.New[pgx.Tx](st)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := consume.New[pgx.Tx, testMsg, options, func(*options) error](errors.New("test: config"), c, &o, &o.Config, nil, consume.Broker[testMsg]{
		Name:    "test",
		Payload: func(testMsg) []byte { return []byte(`{}`) },
		Where:   func(testMsg) []any { return nil },
		Last:    func(testMsg, int) bool { return false },
		Settle: func(_ testMsg, d consume.Decision, _ *slog.Logger) error {
			*settled = append(*settled, d)
			return nil
		},
		HoldGivesUp: holdGivesUp,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

// A broker that cannot hold a message (Kafka) gets an uncertain delivery
// given up: its error matches ErrHeldGivenUp and ErrDeadLetter, and the
// DeadLetter callback gets it before Settle. Without HoldGivesUp the same
// Hold is not given up (the negative control of the check).
func TestConsumer_HoldGivesUp(t *testing.T) {
	for _, gives := range []bool{true, false} {
		var settled []consume.Decision
		var dead []error
		mp := consumetest.NewCounters()
		c := newTestConsumer(t, gives, &settled, &dead, mp)
		act, err := c.Run(t.Context(), testMsg{"m-" + map[bool]string{true: "a", false: "b"}[gives]}, func(context.Context, testMsg, claim.Op) (durable.Result, error) {
			return durable.Result{}, errors.New("gateway timed out")
		})
		if act != consume.Hold || len(settled) != 1 || settled[0].Action != consume.Hold {
			t.Fatalf("HoldGivesUp %v: %v %v, settled %+v; want one Hold", gives, act, err, settled)
		}
		given := errors.Is(err, consume.ErrHeldGivenUp) && errors.Is(err, consume.ErrDeadLetter) && len(dead) == 1
		if given != gives {
			t.Fatalf("HoldGivesUp %v: error %v, dead-letter calls %v", gives, err, dead)
		}
		if gives && !errors.Is(settled[0].Err, consume.ErrHeldGivenUp) {
			t.Fatalf("Settle got %v, want ErrHeldGivenUp", settled[0].Err)
		}
		if n := mp.Get(consumetest.MetricKey("test", "uncertain")); n != map[bool]int64{true: 1, false: 0}[gives] {
			t.Fatalf("HoldGivesUp %v: metric uncertain = %d (have %v)", gives, n, mp.Keys())
		}
	}
}
