package claim_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// effects counts each step's effect by the key its downstream saw, as a
// downstream that does not deduplicate would apply them.
type effects struct {
	mu   sync.Mutex
	runs map[string][]string // step name -> keys it ran with, in order
}

func newEffects() *effects { return &effects{runs: map[string][]string{}} }

// step returns a step function that applies the effect of name.
func (f *effects) step(name string) func(ctx context.Context, key string) ([]byte, error) {
	return func(ctx context.Context, key string) ([]byte, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.runs[name] = append(f.runs[name], key)
		return []byte("did " + name), nil
	}
}

func (f *effects) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.runs[name])
}

// once reports every step of names whose effect did not happen exactly
// once: the checker of the crash-resume tests.
func (f *effects) once(names ...string) error {
	var bad []string
	for _, n := range names {
		if c := f.count(n); c != 1 {
			bad = append(bad, fmt.Sprintf("%s ran %d times", n, c))
		}
	}
	if bad != nil {
		return errors.New(strings.Join(bad, ", "))
	}
	return nil
}

var fourSteps = []string{"reserve", "charge", "receipt", "publish"}

// workflow runs the four steps on l, stopping after stopAfter of them (all
// when stopAfter is 4), and returns the results it got.
func workflow(t *testing.T, l *claim.Lease, f *effects, stopAfter int) []string {
	t.Helper()
	var got []string
	for _, name := range fourSteps[:stopAfter] {
		res, err := l.Step(t.Context(), name, f.step(name))
		if err != nil {
			t.Fatalf("Step(%s): %v", name, err)
		}
		got = append(got, string(res))
	}
	return got
}

// crashAndResume runs the crash schedule of issue 46 on e: a worker takes
// the key, runs two of four steps and dies; its lease runs out; a retry
// takes over and runs the whole workflow. It returns the effects.
func crashAndResume(t *testing.T, e *env) *effects {
	t.Helper()
	f := newEffects()
	r := req("steps-crash", "v1:four")
	first := mustClaim(t, e.c, r, claim.Acquired)
	workflow(t, first.Lease, f, 2) // then the worker dies
	e.expireLease(r)

	second := mustClaim(t, e.c, r, claim.Acquired)
	got := workflow(t, second.Lease, f, 4)
	if want := []string{"did reserve", "did charge", "did receipt", "did publish"}; !slices.Equal(got, want) {
		t.Fatalf("results on resume = %q, want %q", got, want)
	}
	if err := second.Lease.Complete(t.Context(), result("done")); err != nil {
		t.Fatal(err)
	}
	// The worker that died wakes up: it can neither start nor finish a step.
	if _, err := first.Lease.Step(t.Context(), "receipt", f.step("receipt")); !errors.Is(err, claim.ErrFenced) {
		t.Fatalf("stale owner's step = %v, want ErrFenced", err)
	}
	if out := mustClaim(t, e.c, r, claim.Replayed); string(out.Result.Body) != "done" {
		t.Fatalf("replay = %q", out.Result.Body)
	}
	return f
}

// A workflow of four steps killed after the second resumes and runs the
// third and fourth only: each effect happens once, each with the same key
// in every attempt (issue 46, done-when).
func TestStep_ResumeRunsOnlyTheStepsLeft(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode, claim.WithLease(time.Minute))
			f := crashAndResume(t, e)
			if err := f.once(fourSteps...); err != nil {
				t.Fatal(err)
			}
			ref := e.ref(req("steps-crash", "v1:four"))
			for _, name := range fourSteps {
				if want := ref.OperationID() + "/" + name; f.runs[name][0] != want {
					t.Fatalf("step %s ran with key %q, want %q", name, f.runs[name][0], want)
				}
			}
		})
	}
}

// forgetfulStore is the negative control of the resume: a store whose
// StartStep ignores what earlier attempts recorded.
type forgetfulStore struct {
	storeapi.Store[pgx.Tx]
	steps storeapi.StepStore
}

func (s forgetfulStore) StartStep(ctx context.Context, ref durable.Ref, tok fence.Token, p storeapi.StepParams) (storeapi.StepStart, error) {
	if _, err := s.steps.StartStep(ctx, ref, tok, p); err != nil {
		return storeapi.StepStart{}, err
	}
	return storeapi.StepStart{}, nil // "run it"
}

func (s forgetfulStore) FinishStep(ctx context.Context, ref durable.Ref, tok fence.Token, seq int, result []byte) error {
	err := s.steps.FinishStep(ctx, ref, tok, seq, result)
	if errors.Is(err, durable.ErrFenced) {
		return nil // finished by an earlier attempt: this store does not care
	}
	return err
}

func (s forgetfulStore) Steps(ctx context.Context, ref durable.Ref, results bool) ([]durable.Step, error) {
	return s.steps.Steps(ctx, ref, results)
}

func (s forgetfulStore) SettleStep(ctx context.Context, ref durable.Ref, tok fence.Token, seq int, happened bool, result []byte) error {
	return s.steps.SettleStep(ctx, ref, tok, seq, happened, result)
}

// The checker of the crash schedule catches a resume that ignores the
// recorded steps: the first two effects happen twice.
func TestStep_ResumeIgnoringStepsIsCaught(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	c, err := claim.New[pgx.Tx](forgetfulStore{Store: e.store, steps: e.store.(storeapi.StepStore)}, claim.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	f := crashAndResume(t, e)
	err = f.once(fourSteps...)
	if err == nil || !strings.Contains(err.Error(), "reserve ran 2 times") || !strings.Contains(err.Error(), "charge ran 2 times") {
		t.Fatalf("checker on a resume that ignores steps = %v, want reserve and charge twice", err)
	}
}

// A step an earlier attempt started and never finished may have had its
// effect: the resume runs nothing, the operation becomes uncertain at that
// step, and the Reconciler's resolve function is told the step and its key.
// It settles the step either way, and the work resumes on the next claim.
func TestStep_UnfinishedStepIsUncertainUntilSettled(t *testing.T) {
	t.Parallel()
	for _, happened := range []bool{true, false} {
		t.Run(fmt.Sprintf("happened=%v", happened), func(t *testing.T) {
			t.Parallel()
			e := setup(t, withRedis, claim.WithLease(time.Minute))
			f := newEffects()
			r := req("steps-unfinished", "v1:four")
			ref := e.ref(r)
			first := mustClaim(t, e.c, r, claim.Acquired)
			workflow(t, first.Lease, f, 1)
			timeout := errors.New("charge: downstream timed out")
			_, err := first.Lease.Step(t.Context(), "charge", func(ctx context.Context, key string) ([]byte, error) {
				f.step("charge")(ctx, key) // the charge happened; its answer was lost
				return nil, timeout
			})
			if !errors.Is(err, timeout) {
				t.Fatalf("Step(charge) = %v, want the function's error", err)
			}
			// Called again in the same attempt: refused, nothing runs.
			if _, err := first.Lease.Step(t.Context(), "charge", f.step("charge")); !errors.Is(err, claim.ErrStepOrder) {
				t.Fatalf("Step(charge) again = %v, want ErrStepOrder", err)
			}
			e.expireLease(r) // the worker dies

			second := mustClaim(t, e.c, r, claim.Acquired)
			if res, err := second.Lease.Step(t.Context(), "reserve", f.step("reserve")); err != nil || string(res) != "did reserve" {
				t.Fatalf("Step(reserve) on resume = %q, %v", res, err)
			}
			if _, err := second.Lease.Step(t.Context(), "charge", f.step("charge")); !errors.Is(err, claim.ErrStepUncertain) {
				t.Fatalf("Step(charge) on resume = %v, want ErrStepUncertain", err)
			}
			if f.count("charge") != 1 {
				t.Fatalf("charge ran %d times, want 1", f.count("charge"))
			}
			mustClaim(t, e.c, r, claim.Uncertain) // retries are told, nothing runs

			var told *durable.Step
			rec, err := claim.NewReconciler(e.c, func(ctx context.Context, rec durable.Record) (claim.Resolution, error) {
				told = rec.Step
				if happened {
					return claim.StepHappened([]byte("charged ch_1")), nil
				}
				return claim.StepNotHappened(), nil
			})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := rec.RunOnce(t.Context())
			if err != nil || rep.Resolved != 1 {
				t.Fatalf("reconcile = %+v, %v", rep, err)
			}
			if told == nil || told.Name != "charge" || told.Key != ref.OperationID()+"/charge" || told.State != durable.StepUncertain {
				t.Fatalf("resolve was told step %+v, want charge, uncertain, with its key", told)
			}

			third := mustClaim(t, e.c, r, claim.Acquired)
			got := workflow(t, third.Lease, f, 4)
			wantCharge := "did charge"
			if happened {
				wantCharge = "charged ch_1"
			}
			if got[1] != wantCharge {
				t.Fatalf("charge's result on the resume = %q, want %q", got[1], wantCharge)
			}
			if err := third.Lease.Complete(t.Context(), result("done")); err != nil {
				t.Fatal(err)
			}
			wantRuns := 1
			if !happened {
				wantRuns = 2 // it never took effect: run again, with the same key
				if k := f.runs["charge"]; k[0] != k[1] {
					t.Fatalf("charge ran with keys %q", k)
				}
			}
			if f.count("charge") != wantRuns {
				t.Fatalf("charge ran %d times, want %d", f.count("charge"), wantRuns)
			}
			if err := f.once("reserve", "receipt", "publish"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A step declared Repeatable runs again, with the same key, after an
// attempt that started it died.
func TestStep_RepeatableRunsAgainWithItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	f := newEffects()
	r := req("steps-repeatable", "v1:one")
	first := mustClaim(t, e.c, r, claim.Acquired)
	_, err := first.Lease.Step(t.Context(), "notify", func(ctx context.Context, key string) ([]byte, error) {
		f.step("notify")(ctx, key)
		return nil, errors.New("lost answer")
	}, claim.Repeatable())
	if err == nil {
		t.Fatal("Step returned no error")
	}
	// Not repeatable, called again in the same attempt: refused; declared
	// repeatable, it runs again with its key.
	if _, err := first.Lease.Step(t.Context(), "notify", f.step("notify")); !errors.Is(err, claim.ErrStepOrder) {
		t.Fatalf("Step(notify) again without Repeatable = %v, want ErrStepOrder", err)
	}
	_, err = first.Lease.Step(t.Context(), "notify", func(ctx context.Context, key string) ([]byte, error) {
		f.step("notify")(ctx, key)
		return nil, errors.New("lost answer again")
	}, claim.Repeatable())
	if err == nil {
		t.Fatal("Step returned no error")
	}
	e.expireLease(r)
	second := mustClaim(t, e.c, r, claim.Acquired)
	if _, err := second.Lease.Step(t.Context(), "notify", f.step("notify"), claim.Repeatable()); err != nil {
		t.Fatal(err)
	}
	steps, err := e.store.(storeapi.StepStore).Steps(t.Context(), e.ref(r), false)
	if err != nil || len(steps) != 1 || steps[0].Attempts != 2 || steps[0].State != durable.StepFinished {
		t.Fatalf("steps = %+v, %v; want notify finished, started by 2 generations", steps, err)
	}
	if k := f.runs["notify"]; len(k) != 3 || k[0] != k[1] || k[1] != k[2] {
		t.Fatalf("notify ran with keys %q, want three times with one key", k)
	}
}

// Steps are called in the recorded order: a resume calling another
// sequence, or one name twice in an attempt, gets ErrStepOrder and runs
// nothing. Bad arguments reserve nothing.
func TestStep_Order(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	f := newEffects()
	r := req("steps-order", "v1:two")
	first := mustClaim(t, e.c, r, claim.Acquired)
	workflow(t, first.Lease, f, 2)
	if _, err := first.Lease.Step(t.Context(), "reserve", f.step("reserve")); !errors.Is(err, claim.ErrStepOrder) {
		t.Fatalf("same name twice = %v, want ErrStepOrder", err)
	}
	for _, bad := range []string{"", "has space", strings.Repeat("x", 65), "ünïcode"} {
		if _, err := first.Lease.Step(t.Context(), bad, f.step(bad)); !errors.Is(err, claim.ErrConfig) {
			t.Fatalf("Step(%q) = %v, want ErrConfig", bad, err)
		}
	}
	if _, err := first.Lease.Step(t.Context(), "ok", nil); !errors.Is(err, claim.ErrConfig) {
		t.Fatalf("nil function = %v, want ErrConfig", err)
	}
	e.expireLease(r)
	second := mustClaim(t, e.c, r, claim.Acquired)
	if _, err := second.Lease.Step(t.Context(), "charge", f.step("charge")); !errors.Is(err, claim.ErrStepOrder) {
		t.Fatalf("resume calling charge first = %v, want ErrStepOrder", err)
	}
	if err := f.once("reserve", "charge"); err != nil {
		t.Fatal(err)
	}
	steps, err := e.store.(storeapi.StepStore).Steps(t.Context(), e.ref(r), false)
	if err != nil || len(steps) != 2 {
		t.Fatalf("steps = %+v, %v; want the two recorded, nothing for the bad calls", steps, err)
	}
}

// A record past its retention starts a new operation: its earlier steps do
// not count, and the new life runs and records its own.
func TestStep_NewOperationStartsWithoutSteps(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(200*time.Millisecond), claim.WithRetention(300*time.Millisecond))
	f := newEffects()
	r := req("steps-restart", "v1:one")
	first := mustClaim(t, e.c, r, claim.Acquired)
	workflow(t, first.Lease, f, 1)
	if err := first.Lease.Complete(t.Context(), result("done")); err != nil {
		t.Fatal(err)
	}
	var second claim.Outcome
	for deadline := time.Now().Add(10 * time.Second); second.Kind != claim.Acquired; time.Sleep(50 * time.Millisecond) {
		out, err := e.c.Claim(t.Context(), req("steps-restart", "v1:other"))
		if err != nil && !errors.Is(err, claim.ErrMismatch) || time.Now().After(deadline) {
			t.Fatalf("claim past retention = %v, %v", out.Kind, err)
		}
		second = out
	}
	workflow(t, second.Lease, f, 1)
	if f.count("reserve") != 2 {
		t.Fatalf("reserve ran %d times across two operations, want 2", f.count("reserve"))
	}
}

// An operation with recorded steps is never released, by the application
// (Lease.Release in a later attempt that ran no step itself) or by the
// Reconciler's NothingHappened: the next request would start a new
// operation that runs the finished steps again.
func TestStep_OperationWithStepsIsNeverReleased(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	f := newEffects()
	r := req("steps-no-release-later", "v1:two")
	first := mustClaim(t, e.c, r, claim.Acquired)
	workflow(t, first.Lease, f, 1)
	e.expireLease(r)
	second := mustClaim(t, e.c, r, claim.Acquired)
	if err := second.Lease.Release(t.Context()); !errors.Is(err, claim.ErrConfig) {
		t.Fatalf("Release of a takeover with recorded steps = %v, want ErrConfig", err)
	}
	if err := second.Lease.MarkUncertain(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec, err := claim.NewReconciler(e.c, func(context.Context, durable.Record) (claim.Resolution, error) {
		return claim.NothingHappened(), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := rec.RunOnce(t.Context()); err != nil || rep.Errors != 1 || rep.Resolved != 0 {
		t.Fatalf("reconcile with NothingHappened = %+v, %v; want the resolver's error", rep, err)
	}
	// Not a new operation: another request is refused, this one told uncertain.
	if _, err := e.c.Claim(t.Context(), req("steps-no-release-later", "v1:other")); !errors.Is(err, claim.ErrMismatch) {
		t.Fatalf("another request after the refused release = %v, want ErrMismatch", err)
	}
	mustClaim(t, e.c, r, claim.Uncertain)
	if f.count("reserve") != 1 {
		t.Fatalf("reserve ran %d times", f.count("reserve"))
	}
}

// Once a step's function ran, the lease is never released: its effect may
// have happened.
func TestStep_NoReleaseAfterAStepStarted(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	r := req("steps-no-release", "v1:one")
	out := mustClaim(t, e.c, r, claim.Acquired)
	workflow(t, out.Lease, newEffects(), 1)
	if err := out.Lease.Release(t.Context()); !errors.Is(err, claim.ErrConfig) {
		t.Fatalf("Release after a step = %v, want ErrConfig", err)
	}
	mustClaim(t, e.c, r, claim.InProgress) // still held: nothing was released
	if err := out.Lease.MarkUncertain(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// slowClaims answers every claim late, as a loaded store would.
type slowClaims struct {
	storeapi.Store[pgx.Tx]
	delay time.Duration
}

func (s slowClaims) Claim(ctx context.Context, tx pgx.Tx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, tx, p)
	time.Sleep(s.delay)
	return res, err
}

// A takeover whose claim left less than the start margin is not released:
// the work it continues may have had effects (here a recorded step). Its
// lease is ended instead, and the record stays the same operation: another
// request with the key is refused, and the next claim of this one resumes.
func TestClaim_SlowTakeoverIsNotReleased(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	f := newEffects()
	r := req("slow-takeover", "v1:one")
	first := mustClaim(t, e.c, r, claim.Acquired)
	workflow(t, first.Lease, f, 1)
	e.expireLease(r)
	slow, err := claim.New[pgx.Tx](slowClaims{Store: e.store, delay: 300 * time.Millisecond},
		claim.WithLease(time.Second), claim.WithStartMargin(900*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := slow.Claim(t.Context(), r); !errors.Is(err, claim.ErrLeaseExpired) {
		t.Fatalf("slow takeover = %v, want ErrLeaseExpired", err)
	}
	if _, err := e.c.Claim(t.Context(), req("slow-takeover", "v1:other")); !errors.Is(err, claim.ErrMismatch) {
		t.Fatalf("another request after the slow takeover = %v, want ErrMismatch (the same operation)", err)
	}
	resumed := mustClaim(t, e.c, r, claim.Acquired)
	workflow(t, resumed.Lease, f, 2)
	if err := f.once("reserve", "charge"); err != nil {
		t.Fatal(err)
	}
}
