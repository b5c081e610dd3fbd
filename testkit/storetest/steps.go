package storetest

// A workflow's recorded steps (storeapi.StepStore; claim's Lease.Step).

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// stepStore returns s as a StepStore; every backend records steps.
func stepStore[TTx any](t *testing.T, s storeapi.Store[TTx]) storeapi.StepStore {
	t.Helper()
	st, ok := s.(storeapi.StepStore)
	if !ok {
		t.Fatalf("%T records no steps (storeapi.StepStore)", s)
	}
	return st
}

func step(seq int, name string) storeapi.StepParams { return storeapi.StepParams{Seq: seq, Name: name} }

func mustStart(t *testing.T, st storeapi.StepStore, ref durable.Ref, tok fence.Token, p storeapi.StepParams, want storeapi.StepStart) {
	t.Helper()
	got, err := st.StartStep(ctxFor(t), ref, tok, p)
	if err != nil {
		t.Fatalf("StartStep(%d %s): %v", p.Seq, p.Name, err)
	}
	if got.Finished != want.Finished || got.Repeated != want.Repeated || got.Uncertain != want.Uncertain || !bytes.Equal(got.Result, want.Result) {
		t.Fatalf("StartStep(%d %s) = %+v, want %+v", p.Seq, p.Name, got, want)
	}
	if got.Finished && got.Result == nil {
		t.Fatalf("StartStep(%d %s): a finished step's result is nil", p.Seq, p.Name)
	}
}

func mustSteps(t *testing.T, st storeapi.StepStore, ref durable.Ref, results bool) []durable.Step {
	t.Helper()
	steps, err := st.Steps(ctxFor(t), ref, results)
	if err != nil {
		t.Fatalf("Steps: %v", err)
	}
	return steps
}

// A started step is finished once under the token; started again by that
// token it returns its result; another name at its place is out of order.
// Steps lists it with its key, size and, when asked, its result.
func (c *contract[TTx]) stepsRecord(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	st := stepStore(t, s)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	if steps := mustSteps(t, st, ref, false); len(steps) != 0 {
		t.Fatalf("steps of a new record: %+v", steps)
	}
	mustStart(t, st, ref, a, step(0, "reserve"), storeapi.StepStart{})
	mustStart(t, st, ref, a, step(0, "reserve"), storeapi.StepStart{}) // its reply lost: still to run
	must(t, "FinishStep", st.FinishStep(ctx, ref, a, 0, []byte("r-1")))
	must(t, "FinishStep again with the same result", st.FinishStep(ctx, ref, a, 0, []byte("r-1")))
	wantErr(t, "FinishStep with another result", st.FinishStep(ctx, ref, a, 0, []byte("r-2")), durable.ErrFenced)
	mustStart(t, st, ref, a, step(0, "reserve"), storeapi.StepStart{Finished: true, Result: []byte("r-1")})
	_, err := st.StartStep(ctx, ref, a, step(0, "charge"))
	wantErr(t, "another name at a recorded place", err, durable.ErrStepOrder)
	mustStart(t, st, ref, a, step(1, "charge"), storeapi.StepStart{})
	must(t, "FinishStep with an empty result", st.FinishStep(ctx, ref, a, 1, nil))
	mustStart(t, st, ref, a, step(1, "charge"), storeapi.StepStart{Finished: true, Result: []byte{}})
	mustStart(t, st, ref, a, step(2, "receipt"), storeapi.StepStart{})

	steps := mustSteps(t, st, ref, true)
	if len(steps) != 3 {
		t.Fatalf("steps = %+v, want 3", steps)
	}
	for i, want := range []struct {
		name   string
		state  durable.StepState
		result string
	}{{"reserve", durable.StepFinished, "r-1"}, {"charge", durable.StepFinished, ""}, {"receipt", durable.StepStarted, ""}} {
		got := steps[i]
		if got.Seq != i || got.Name != want.name || got.State != want.state || got.Key != ref.OperationID()+"/"+want.name ||
			got.Generation != a.Generation || got.Attempts != 1 || got.Size != len(want.result) || string(got.Result) != want.result ||
			got.StartedAt.IsZero() || got.FinishedAt.IsZero() != (want.state != durable.StepFinished) {
			t.Fatalf("step %d = %+v, want %s %s with result %q", i, got, want.name, want.state, want.result)
		}
	}
	if r := mustSteps(t, st, ref, false); r[0].Result != nil || r[0].Size != 3 {
		t.Fatalf("step without results asked = %+v, want its size and no result", r[0])
	}
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()))
	_, err = st.StartStep(ctx, ref, a, step(3, "publish"))
	wantErr(t, "StartStep on a completed record", err, durable.ErrFenced)
	wantErr(t, "FinishStep on a completed record", st.FinishStep(ctx, ref, a, 2, []byte("late")), durable.ErrFenced)
}

// After a takeover the old owner can neither start nor finish a step; the
// new owner gets finished steps back, and a step the old owner left
// started is uncertain (the record with it), unless it is repeatable.
func (c *contract[TTx]) stepsTakeover(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	st := stepStore(t, s)
	a := mustAcquire(t, s, params(sc, fp1, short, long))
	mustStart(t, st, ref, a, step(0, "reserve"), storeapi.StepStart{})
	must(t, "FinishStep", st.FinishStep(ctx, ref, a, 0, []byte("r")))
	mustStart(t, st, ref, a, step(1, "notify"), storeapi.StepStart{})
	mustStart(t, st, ref, a, step(2, "charge"), storeapi.StepStart{})
	waitLeaseExpired(t, s, ref)
	b := mustAcquire(t, s, params(sc, fp1, long, long))

	wantErr(t, "old owner's FinishStep", st.FinishStep(ctx, ref, a, 2, []byte("c")), durable.ErrFenced)
	_, err := st.StartStep(ctx, ref, a, step(3, "receipt"))
	wantErr(t, "old owner's StartStep", err, durable.ErrFenced)

	mustStart(t, st, ref, b, step(0, "reserve"), storeapi.StepStart{Finished: true, Result: []byte("r")})
	mustStart(t, st, ref, b, storeapi.StepParams{Seq: 1, Name: "notify", Repeatable: true}, storeapi.StepStart{Repeated: true})
	must(t, "FinishStep of the repeated step", st.FinishStep(ctx, ref, b, 1, []byte("n")))
	mustStart(t, st, ref, b, step(2, "charge"), storeapi.StepStart{Uncertain: true})
	rec := mustGet(t, s, ref)
	checkState(t, "after an unfinished step", rec, durable.Uncertain)
	if rec.LeaseRemaining != 0 {
		t.Fatalf("record uncertain at a step kept its lease: %+v", rec)
	}
	_, err = st.StartStep(ctx, ref, b, step(3, "receipt"))
	wantErr(t, "StartStep on the uncertain record", err, durable.ErrFenced)
	steps := mustSteps(t, st, ref, false)
	if len(steps) != 3 || steps[1].Attempts != 2 || steps[1].Generation != b.Generation || steps[1].State != durable.StepFinished ||
		steps[2].State != durable.StepUncertain || steps[2].Generation != a.Generation {
		t.Fatalf("steps = %+v, want notify finished after 2 attempts and charge uncertain at the old generation", steps)
	}
}

// The reconciler's token settles the step an operation stopped at, either
// way, and hands the record back to the work: processing with its lease run
// out, so the next claim of the same request takes it over and resumes.
func (c *contract[TTx]) stepsSettle(t *testing.T) {
	for _, happened := range []bool{true, false} {
		s, ctx, sc, ref := c.fresh(t)
		st := stepStore(t, s)
		a := mustAcquire(t, s, params(sc, fp1, long, long))
		mustStart(t, st, ref, a, step(0, "charge"), storeapi.StepStart{})
		wantErr(t, "SettleStep by a token that does not hold the record",
			st.SettleStep(ctx, ref, fence.Token{Generation: a.Generation + 1, Owner: uuid.New()}, 0, true, nil), durable.ErrFenced)
		must(t, "MarkUncertain", s.MarkUncertain(ctx, ref, a))
		wantErr(t, "SettleStep by the token that marked the record uncertain (not adopted)",
			st.SettleStep(ctx, ref, a, 0, true, nil), durable.ErrFenced)
		r, err := s.Adopt(ctx, ref, uuid.New(), 0, long)
		must(t, "Adopt", err)
		wantErr(t, "SettleStep of a step that is not there", st.SettleStep(ctx, ref, r, 5, true, nil), durable.ErrNotFound)
		must(t, "SettleStep", st.SettleStep(ctx, ref, r, 0, happened, []byte("ch_1")))
		rec := mustGet(t, s, ref)
		checkState(t, "settled", rec, durable.Processing)
		if rec.Released || rec.LeaseRemaining != 0 {
			t.Fatalf("settled record %+v: want it held with its lease run out", rec)
		}
		res, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
		wantErr(t, "claim of the settled record with another request", err, durable.ErrMismatch)
		_ = res
		b := mustAcquire(t, s, params(sc, fp1, long, long))
		if happened {
			mustStart(t, st, ref, b, step(0, "charge"), storeapi.StepStart{Finished: true, Result: []byte("ch_1")})
		} else {
			mustStart(t, st, ref, b, step(0, "charge"), storeapi.StepStart{})
		}
	}
}

// A record restarted as a new operation (released, here) has no steps; the
// new operation records its own in their places.
func (c *contract[TTx]) stepsNewLife(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	st := stepStore(t, s)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	mustStart(t, st, ref, a, step(0, "reserve"), storeapi.StepStart{})
	must(t, "FinishStep", st.FinishStep(ctx, ref, a, 0, []byte("old")))
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, a))
	b := mustAcquire(t, s, params(sc, fp2, long, long))
	if steps := mustSteps(t, st, ref, false); len(steps) != 0 {
		t.Fatalf("steps of the new operation: %+v, want none", steps)
	}
	mustStart(t, st, ref, b, step(0, "refund"), storeapi.StepStart{})
	if steps := mustSteps(t, st, ref, false); len(steps) != 1 || steps[0].Name != "refund" {
		t.Fatalf("steps = %+v, want the new operation's refund", steps)
	}
}

// Bad step arguments are refused with ErrInvalidScope and write nothing.
func (c *contract[TTx]) stepsInvalid(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	st := stepStore(t, s)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	for _, p := range []storeapi.StepParams{step(0, ""), step(0, "a b"), step(0, strings.Repeat("n", 65)), step(-1, "ok")} {
		_, err := st.StartStep(ctx, ref, a, p)
		wantErr(t, "StartStep with a bad step", err, durable.ErrInvalidScope)
	}
	mustStart(t, st, ref, a, step(0, "big"), storeapi.StepStart{})
	wantErr(t, "FinishStep with a result over 1 MiB", st.FinishStep(ctx, ref, a, 0, make([]byte, storeapi.MaxStepResult+1)), durable.ErrInvalidScope)
	steps := mustSteps(t, st, ref, false)
	if len(steps) != 1 || steps[0].State != durable.StepStarted {
		t.Fatalf("steps = %+v, want big alone, still started", steps)
	}
}
