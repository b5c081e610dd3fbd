package claim

import "testing"

// With no MeterProvider, a claim's metric bookkeeping allocates nothing
// (and reads no clock for a duration nobody records).
func TestMetersOff_AllocateNothing(t *testing.T) {
	c := &Claimer[struct{}]{}
	m, err := newMeters(c)
	if err != nil {
		t.Fatal(err)
	}
	if s := m.start(); !s.IsZero() {
		t.Fatalf("start = %v with metrics off", s)
	}
	ctx := t.Context()
	if n := testing.AllocsPerRun(100, func() {
		s := m.start()
		m.replay(ctx, true)
		m.claimDone(ctx, s, Replayed, nil)
	}); n != 0 {
		t.Fatalf("%v allocations per claim", n)
	}
}
