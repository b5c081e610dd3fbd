package claim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// Resolution is what the resolve function given to [NewReconciler] learned
// about an operation: [Resolved], [Unresolved] or [NothingHappened].
type Resolution struct {
	state   durable.State // "" while unresolved
	result  durable.Result
	release bool       // NothingHappened
	step    *stepTruth // StepHappened, StepNotHappened
}

// stepTruth is what a resolver learned of the step an operation stopped at.
type stepTruth struct {
	happened bool
	result   []byte
}

// StepHappened returns the Resolution of an operation that stopped at a
// step ([durable.Record.Step]) whose effect the application knows happened,
// with result as the step's result (at most 1 MiB): the step is recorded
// finished with it, and the work resumes on the next claim of the same
// request (an HTTP retry, a River retry), which runs only the steps after
// it. The record goes back to processing, with its lease run out.
func StepHappened(result []byte) Resolution {
	if result == nil {
		result = []byte{}
	}
	return Resolution{step: &stepTruth{happened: true, result: result}}
}

// StepNotHappened returns the Resolution of an operation that stopped at a
// step ([durable.Record.Step]) the application knows never took effect: the
// step is recorded as never started, and the work resumes on the next claim
// of the same request, which runs it with the same key. As with
// [NothingHappened], it is the application's word; the Reconciler never
// assumes it. Say it only once no call of the step can still land: the
// worker that started it (at Step.StartedAt) may still have one in flight
// for as long as its longest call takes, and a downstream that does not
// deduplicate by the step's key would then apply both.
func StepNotHappened() Resolution { return Resolution{step: &stepTruth{}} }

// Resolved returns the Resolution of an operation whose outcome is known:
// state is durable.Completed or durable.Failed (any other state is an error
// of the resolver, and the record is left as it is), and res is stored as
// its result and replayed to every retry.
func Resolved(state durable.State, res durable.Result) Resolution {
	return Resolution{state: state, result: res}
}

// Unresolved returns the Resolution of an operation whose outcome is still
// unknown: the record is left uncertain, for a later pass, an operator or
// the application. A processing record whose worker vanished, adopted by
// the pass, is marked uncertain then: no retry takes it over and runs it
// again, as it would once the adopted lease ran out if it stayed
// processing. A resolve function that has no say on some records (another
// operation's) keeps them out of the pass with [WithSkip] rather than
// answer Unresolved for them. It is the zero Resolution.
func Unresolved() Resolution { return Resolution{} }

// NothingHappened returns the Resolution of an operation the application
// knows never took effect (the downstream never received the request, and
// never will): the record is released, and the next request with its key
// runs as a new operation. For an operation with recorded steps it is an
// error of the resolver (the record is left as it is): settle the step
// ([StepHappened], [StepNotHappened]) or the operation ([Resolved]). It is the application's word, as with
// [Lease.Release]; the Reconciler never assumes it. Any call the original
// worker may still have in flight carries an older token, which a
// downstream fencing on it refuses.
func NothingHappened() Resolution { return Resolution{release: true} }

// ReconcilerOption configures a [Reconciler]. An option given a bad value
// makes [NewReconciler] fail with an error that matches [ErrConfig].
type ReconcilerOption func(*reconcilerConfig) error

type reconcilerConfig struct {
	staleAfter time.Duration
	batch      int
	skip       func(context.Context, durable.Record) (bool, error)
}

// WithStaleAfter, a [ReconcilerOption], selects, besides uncertain records, processing
// records whose lease expired at least d ago: their worker is presumed
// dead. Defaults to 5 minutes. Not negative.
func WithStaleAfter(d time.Duration) ReconcilerOption {
	return func(c *reconcilerConfig) error {
		if d < 0 {
			return configErr("WithStaleAfter: must not be negative, got %v", d)
		}
		c.staleAfter = d
		return nil
	}
}

// WithSkip, a [ReconcilerOption], has each pass ask skip about every pending record before
// adopting it: a record skip reports (true) is left as it is for this pass
// and counted as skipped; an error counts as the record's error. It keeps
// the Reconciler off records that another mechanism still continues: an
// asynchronous runner's job retries the processing records of its
// operations itself (claimriver.Runner.SkipLiveJobs). Not nil.
func WithSkip(skip func(ctx context.Context, rec durable.Record) (bool, error)) ReconcilerOption {
	return func(c *reconcilerConfig) error {
		if skip == nil {
			return configErr("WithSkip: nil function")
		}
		c.skip = skip
		return nil
	}
}

// WithBatch, a [ReconcilerOption], bounds the records handled per pass
// (not to be confused with [WithSweepBatch], a Claimer's). Defaults to 100. At
// least 1.
func WithBatch(n int) ReconcilerOption {
	return func(c *reconcilerConfig) error {
		if n < 1 {
			return configErr("WithBatch: must be at least 1, got %d", n)
		}
		c.batch = n
		return nil
	}
}

// Report counts what one reconciliation pass did. Records scanned but in
// none of the other counts were skipped: another worker or reconciler held
// or finished them first.
type Report struct {
	// Scanned counts the records the pass found pending.
	Scanned int
	// Resolved counts the records it settled: stored a completed or
	// failed result for, released ([NothingHappened]), or settled the
	// step of and handed back to the work ([StepHappened],
	// [StepNotHappened]).
	Resolved int
	// Unresolved counts the records the resolver could not tell about yet
	// ([Unresolved]); they are left uncertain (a stale processing record
	// is marked so).
	Unresolved int
	// Errors counts the records whose resolution failed (the resolver's
	// error, or the store's); each is logged and left for a later pass.
	Errors int
}

// Reconciler resolves uncertain records, and processing records whose
// worker vanished, under a new generation: it adopts each record (so a late
// original worker is fenced) for the Claimer's lease, asks the resolve
// function for the truth, and stores it. It never guesses: an unresolved
// outcome stays uncertain (a stale processing record is marked uncertain),
// so nothing runs it again until the application or an operator settles
// it.
type Reconciler[TTx any] struct {
	c       *Claimer[TTx]
	resolve func(context.Context, durable.Record) (Resolution, error)
	cfg     reconcilerConfig

	mu      sync.Mutex
	running bool
}

// NewReconciler returns a Reconciler for the records of c's store. resolve
// asks the outside world what became of an operation, for example by
// querying the downstream system with the identity the original worker
// passed it, rec.Ref.OperationID(). rec.Token is the reconciler's own
// token, which fences the original worker out. An error from resolve leaves
// the record for a later pass.
//
// Errors match [ErrConfig]: a nil Claimer or resolve, a bad option.
func NewReconciler[TTx any](c *Claimer[TTx], resolve func(ctx context.Context, rec durable.Record) (Resolution, error), opts ...ReconcilerOption) (*Reconciler[TTx], error) {
	if c == nil || resolve == nil {
		return nil, configErr("NewReconciler needs a Claimer and a resolve function")
	}
	cfg := reconcilerConfig{staleAfter: 5 * time.Minute, batch: 100}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	return &Reconciler[TTx]{c: c, resolve: resolve, cfg: cfg}, nil
}

// tally counts the records of one pass by how each ended, as the
// oncekey.reconciled metric reports them.
type tally struct {
	scanned, completed, failed, released, resumed, unknown, skipped, errors int
}

func (t tally) report() Report {
	return Report{Scanned: t.scanned, Resolved: t.completed + t.failed + t.released + t.resumed, Unresolved: t.unknown, Errors: t.errors}
}

// RunOnce runs one pass over at most a batch of records
// ([WithBatch]). ctx bounds the pass.
func (r *Reconciler[TTx]) RunOnce(ctx context.Context) (Report, error) {
	var t tally
	recs, err := r.c.store.Pending(ctx, r.cfg.staleAfter, r.cfg.batch)
	if err != nil {
		return Report{}, wrap("reconcile", err)
	}
	for _, rec := range recs {
		t.scanned++
		if ctx.Err() != nil {
			return t.report(), ctx.Err()
		}
		switch err := r.one(ctx, rec, &t); {
		case err == nil:
		case errors.Is(err, durable.ErrBusy), errors.Is(err, durable.ErrNotFound), errors.Is(err, durable.ErrFenced):
			t.skipped++ // someone else got there first
		default:
			t.errors++
			r.c.log.Warn("oncekey: reconcile failed", logkeys.Op, rec.Ref, logkeys.Err, err)
		}
	}
	r.c.metrics.reconciled(ctx, t)
	return t.report(), nil
}

func (r *Reconciler[TTx]) one(ctx context.Context, rec durable.Record, t *tally) (err error) {
	ctx, span := r.c.tracing.start(ctx, spanReconcile)
	before := *t
	defer func() { endReconcile(span, rec, before, *t, err) }()
	if r.cfg.skip != nil {
		skip, err := r.cfg.skip(ctx, rec)
		if err != nil {
			return fmt.Errorf("claim: skip: %w", err)
		}
		if skip {
			t.skipped++
			return nil
		}
	}
	var tok fence.Token
	err = r.c.tracing.step(ctx, spanDurableAdopt, func(ctx context.Context) (err error) {
		tok, err = r.c.store.Adopt(ctx, rec.Ref, uuid.New(), 0, r.c.cfg.lease)
		return err
	})
	if err != nil {
		return err
	}
	r.c.metrics.takeover(ctx)
	rec.Token = tok
	steps, err := r.c.listSteps(ctx, rec.Ref)
	if err != nil {
		return err
	}
	rec.Step = storeapi.CurrentStep(steps)
	res, err := r.resolve(r.c.withOperationBaggage(ctx, rec.Ref.OperationID()), rec)
	if err != nil {
		return fmt.Errorf("claim: resolve: %w", err)
	}
	switch {
	case res.step != nil:
		// The application's word on the step the operation stopped at:
		// recorded, and the work resumes on the next claim.
		if rec.Step == nil {
			return fmt.Errorf("claim: resolver settled a step, but operation %s stopped at none", rec.Ref)
		}
		err = r.c.tracing.step(ctx, spanDurableWrite, func(ctx context.Context) error {
			return r.c.store.SettleStep(ctx, rec.Ref, tok, rec.Step.Seq, res.step.happened, res.step.result)
		})
		if err == nil {
			t.resumed++
		}
		return err
	case res.release && len(steps) > 0:
		// Recorded steps say something happened, or may have: a release
		// would start a new operation that runs them all again.
		return fmt.Errorf("claim: resolver said nothing happened, but operation %s has recorded steps: settle its step or the operation", rec.Ref)
	case res.release:
		// The application's word that nothing happened: the key is free.
		err = r.c.tracing.step(ctx, spanDurableWrite, func(ctx context.Context) error {
			return r.c.store.Release(ctx, *new(TTx), rec.Ref, tok)
		})
		if err == nil {
			t.released++
		}
		return err
	}
	switch res.state {
	case durable.Completed:
		err = r.c.tracing.step(ctx, spanDurableWrite, func(ctx context.Context) error {
			return r.c.store.Complete(ctx, *new(TTx), rec.Ref, tok, res.result)
		})
		if err == nil {
			t.completed++
		}
	case durable.Failed:
		err = r.c.tracing.step(ctx, spanDurableWrite, func(ctx context.Context) error {
			return r.c.store.Fail(ctx, *new(TTx), rec.Ref, tok, res.result)
		})
		if err == nil {
			t.failed++
		}
	case "":
		if rec.State == durable.Processing {
			// Adopted from a worker that vanished mid-work, and the
			// application cannot tell whether the work happened: the
			// record is uncertain now. Left processing under this lease,
			// a retry would take it over once the lease ran out and run
			// the work again. Uncertain, it waits for a later pass, an
			// operator or the application (issue 27 #9).
			err = r.c.tracing.step(ctx, spanDurableWrite, func(ctx context.Context) error {
				return r.c.markUncertain(ctx, rec.Ref, tok)
			})
			if err != nil {
				return err
			}
			r.c.metrics.uncertain(ctx)
		}
		t.unknown++
		return nil
	default:
		return fmt.Errorf("claim: resolver returned state %q", res.state)
	}
	return err
}

// Run runs a pass every interval until ctx is done, and returns nil then.
// A failed pass is logged and the next one runs at the next interval.
// Errors: [ErrConfig] for an interval that is not positive, or when the
// Reconciler is already running.
func (r *Reconciler[TTx]) Run(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return configErr("Reconciler.Run: interval must be positive, got %v", every)
	}
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return configErr("Reconciler.Run: already running")
	}
	r.running = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.c.log.Warn("oncekey: reconcile pass failed", logkeys.Err, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
