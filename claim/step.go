package claim

import (
	"context"
	"errors"
	"fmt"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/internal/logkeys"
)

var (
	// ErrStepOrder is returned by [Lease.Step] when the workflow calls its
	// steps in another order than the one recorded for the operation (a
	// resume that calls a different sequence), or calls one name twice in
	// one attempt. Nothing ran. It is the same value as
	// [durable.ErrStepOrder].
	ErrStepOrder = durable.ErrStepOrder

	// ErrStepUncertain is returned by [Lease.Step] for a step that an
	// earlier attempt started and never finished, and that is not
	// [Repeatable]: its effect may have happened. Nothing ran; the
	// operation is now uncertain at that step (the record names it), the
	// lease is over, and retries are answered [Uncertain] until a
	// [Reconciler] or an operator settles the step or the operation.
	ErrStepUncertain = errors.New("claim: step started by an earlier attempt and never finished")
)

// StepOption configures one [Lease.Step].
type StepOption func(*stepConfig)

type stepConfig struct{ repeatable bool }

// Repeatable, a [StepOption], declares that the step may run again after
// an earlier attempt started it and never finished it: its downstream
// deduplicates by the step's key, so a second call with the same key has no
// second effect. Without it such a step makes the operation uncertain
// ([ErrStepUncertain]).
func Repeatable() StepOption { return func(c *stepConfig) { c.repeatable = true } }

// stepMemo is what a Lease knows of one of its steps in this attempt.
type stepMemo struct {
	seq    int
	state  stepRun
	result []byte // the function's result, once it returned
}

type stepRun int

const (
	stepNotRun   stepRun = iota // not started, or its start's reply was lost: the function has not run
	stepRan                     // the function returned a result that is not recorded yet
	stepFailed                  // the function returned an error, or its result was refused: it may have had its effect
	stepRecorded                // finished (now or by an earlier attempt), or uncertain: never again in this attempt
)

// Step runs one step of the workflow, at most once per operation across
// attempts and takeovers:
//
//   - A step that an earlier attempt (any generation) finished returns its
//     recorded result; fn does not run.
//   - Otherwise the step is recorded as started, fenced by the lease's
//     token, fn runs with key, the step's downstream idempotency key (the
//     operation identity and name, "op_.../charge", the same for every
//     attempt: pass it to the downstream so it can deduplicate), and its
//     result is recorded, fenced, before Step returns it.
//   - A step an earlier attempt started and never finished may have had its
//     effect. With [Repeatable] it runs again with the same key; otherwise
//     nothing runs, the operation becomes uncertain at this step, and Step
//     returns [ErrStepUncertain].
//
// Steps run one at a time, in the order the code calls them; name (1 to 64
// letters, digits, '-', '_' or '.') is unique within the workflow. A
// resume must call the same sequence: a different name where a step is
// recorded, or a name called twice in one attempt, returns [ErrStepOrder]
// and runs nothing.
//
// When fn returns an error, Step returns it and the step stays started (its
// effect may have happened): end the work with [Lease.Fail] or
// [Lease.MarkUncertain], or let a resume decide by the rules above; a
// [Repeatable] step may also be called again in the same attempt, and runs
// again with its key. [Lease.Release] refuses once a step started. A result longer than 1 MiB is
// refused the same way (the step stays started). Errors otherwise:
// [ErrFenced] (another worker holds the operation; nothing ran, or fn's
// result was not recorded), [ErrUnavailable] (the store could not be
// reached: before fn, nothing ran and calling Step again is safe; after fn,
// its result is kept and calling Step again records it without running
// fn), [ErrConfig] (a bad name or a nil fn).
func (l *Lease) Step(ctx context.Context, name string, fn func(ctx context.Context, key string) ([]byte, error), opts ...StepOption) ([]byte, error) {
	if !storeapi.ValidStepName(name) {
		return nil, configErr("Step: name %q is not 1 to 64 letters, digits, '-', '_' or '.'", name)
	}
	if fn == nil {
		return nil, configErr("Step %q: nil function", name)
	}
	var cfg stepConfig
	for _, o := range opts {
		o(&cfg)
	}
	store := l.c.steps()
	l.stepMu.Lock()
	defer l.stepMu.Unlock()
	if l.stepsByName == nil {
		l.stepsByName = map[string]*stepMemo{}
	}
	m := l.stepsByName[name]
	switch {
	case m == nil:
		m = &stepMemo{seq: l.nextStep}
		l.nextStep++
		l.stepsByName[name] = m
	case m.state == stepRan:
		// fn ran and its result is not recorded: record it, never run again.
		if err := l.finishStep(ctx, store, m); err != nil {
			return nil, err
		}
		return m.result, nil
	case m.state == stepFailed && cfg.repeatable:
		// fn failed in this attempt; a repeatable step runs again with its key.
	case m.state != stepNotRun:
		return nil, fmt.Errorf("claim: step %q: %w: called twice in one attempt", name, ErrStepOrder)
	}
	key := storeapi.StepKey(l.ref, name)
	start, err := store.StartStep(ctx, l.ref, l.tok, storeapi.StepParams{Seq: m.seq, Name: name, Repeatable: cfg.repeatable})
	if err != nil {
		if errors.Is(err, ErrStepOrder) {
			m.state = stepRecorded // this name has another place in the recorded sequence
		}
		if errors.Is(err, durable.ErrFenced) {
			l.c.meters().fenced(ctx)
		}
		return nil, fmt.Errorf("claim: step %q: %w", name, err)
	}
	switch {
	case start.Finished:
		m.state = stepRecorded
		return start.Result, nil
	case start.Uncertain:
		m.state = stepRecorded
		l.c.meters().uncertain(ctx)
		l.releaseRedis(ctx)
		l.c.logger().Warn("oncekey: operation uncertain at a step an earlier attempt never finished",
			logkeys.Op, l.ref, logkeys.Step, name, logkeys.Generation, l.tok.Generation)
		return nil, fmt.Errorf("claim: step %q: %w", name, ErrStepUncertain)
	}
	m.state = stepFailed // until fn returns a result: a panic leaves it started
	l.started.Store(true)
	res, err := fn(ctx, key)
	if err != nil {
		return nil, err
	}
	if len(res) > storeapi.MaxStepResult {
		return nil, fmt.Errorf("claim: step %q: %w", name, storeapi.Invalid("step result", "longer than 1 MiB"))
	}
	if res == nil {
		res = []byte{}
	}
	m.state, m.result = stepRan, res
	if err := l.finishStep(ctx, store, m); err != nil {
		return nil, err
	}
	return res, nil
}

// stepStarted reports whether a step's function ran (or runs) in this
// attempt: from then on the lease is never released.
func (l *Lease) stepStarted() bool { return l.started.Load() }

// finishStep records m's result, fenced; m is recorded once it succeeds.
func (l *Lease) finishStep(ctx context.Context, store storeapi.StepStore, m *stepMemo) error {
	if err := store.FinishStep(ctx, l.ref, l.tok, m.seq, m.result); err != nil {
		if errors.Is(err, durable.ErrFenced) {
			l.c.meters().fenced(ctx)
			m.state = stepRecorded // another worker holds the operation: this attempt is over
		}
		return wrap("step", err)
	}
	m.state = stepRecorded
	return nil
}

// steps returns the Claimer's store as the recorder of steps.
func (c *Claimer[TTx]) steps() storeapi.StepStore { return c.store }

// listSteps lists the recorded steps of ref's operation in its current
// life, in order, without their results; nil when it has none.
func (c *Claimer[TTx]) listSteps(ctx context.Context, ref durable.Ref) ([]durable.Step, error) {
	return c.store.Steps(ctx, ref, false)
}
