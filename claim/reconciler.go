package claim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
)

// Resolution is what a [ResolveFunc] learned about an operation.
type Resolution struct {
	// State is durable.Completed or durable.Failed when the truth is known,
	// and empty when it is still unknown (the record is left for later).
	State durable.State
	// Result is stored and replayed when State is set.
	Result durable.Result
}

// Unknown is the Resolution for an operation whose outcome is still unknown.
var Unknown = Resolution{}

// Pending is a record handed to a [ResolveFunc].
type Pending struct {
	// OperationID is the stable identity the original worker passed
	// downstream; ask the downstream system about it.
	OperationID string
	Record      durable.Record
}

// ResolveFunc asks the outside world what became of an operation, for
// example by querying the downstream system with the operation identity. An
// error leaves the record for a later pass.
type ResolveFunc func(ctx context.Context, p Pending) (Resolution, error)

// ReconcilerOptions configure a [Reconciler].
type ReconcilerOptions struct {
	// Interval between passes. Defaults to 30s.
	Interval time.Duration
	// StaleFor selects processing records whose lease expired at least
	// this long ago (their worker is presumed dead). Defaults to 5 minutes.
	StaleFor time.Duration
	// Batch bounds the records handled per pass. Defaults to 100.
	Batch int
	// Lease is how long the reconciler holds a record while it resolves
	// it. Defaults to the Claimer's lease.
	Lease time.Duration
}

// Report counts what one reconciliation pass did.
type Report struct {
	Scanned, Completed, Failed, Unknown, Skipped, Errors int
}

// Reconciler resolves uncertain records, and processing records whose
// worker vanished, under a new generation: it adopts each record (so a late
// original worker is fenced), asks the ResolveFunc for the truth, and stores
// it. It never guesses: an unknown outcome is left as it is.
type Reconciler[TTx any] struct {
	c       *Claimer[TTx]
	resolve ResolveFunc
	opts    ReconcilerOptions

	mu      sync.Mutex
	stop    context.CancelFunc
	stopped chan struct{}
}

// NewReconciler returns a Reconciler for the records of c's store.
func NewReconciler[TTx any](c *Claimer[TTx], resolve ResolveFunc, opts ReconcilerOptions) (*Reconciler[TTx], error) {
	if c == nil || resolve == nil {
		return nil, errors.New("claim: NewReconciler needs a Claimer and a ResolveFunc")
	}
	if opts.Interval == 0 {
		opts.Interval = 30 * time.Second
	}
	if opts.StaleFor == 0 {
		opts.StaleFor = 5 * time.Minute
	}
	if opts.Batch == 0 {
		opts.Batch = 100
	}
	if opts.Lease == 0 {
		opts.Lease = c.cfg.lease
	}
	if opts.Interval < 0 || opts.StaleFor < 0 || opts.Batch < 0 || opts.Lease < time.Millisecond {
		return nil, errors.New("claim: reconciler options must be positive (lease at least 1ms)")
	}
	return &Reconciler[TTx]{c: c, resolve: resolve, opts: opts}, nil
}

// RunOnce runs one pass over at most Batch records. ctx bounds the pass.
func (r *Reconciler[TTx]) RunOnce(ctx context.Context) (Report, error) {
	var rep Report
	recs, err := r.c.store.Pending(ctx, r.opts.StaleFor, r.opts.Batch)
	if err != nil {
		return rep, wrap("reconcile", err)
	}
	for _, rec := range recs {
		rep.Scanned++
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		switch err := r.one(ctx, rec, &rep); {
		case err == nil:
		case errors.Is(err, durable.ErrBusy), errors.Is(err, durable.ErrNotFound), errors.Is(err, durable.ErrFenced):
			rep.Skipped++ // someone else got there first
		default:
			rep.Errors++
			r.c.log.Warn("oncekey: reconcile failed", "op", rec.Ref, "err", err)
		}
	}
	r.c.m.reconciled(ctx, rep)
	return rep, nil
}

func (r *Reconciler[TTx]) one(ctx context.Context, rec durable.Record, rep *Report) error {
	tok, err := r.c.store.Adopt(ctx, rec.Ref, uuid.New(), 0, r.opts.Lease)
	if err != nil {
		return err
	}
	r.c.m.takeover(ctx)
	rec.Token = tok
	res, err := r.resolve(ctx, Pending{OperationID: rec.Ref.OperationID(), Record: rec})
	if err != nil {
		return fmt.Errorf("resolve: %w", err)
	}
	switch res.State {
	case durable.Completed:
		err = r.c.store.Complete(ctx, *new(TTx), rec.Ref, tok, res.Result)
		if err == nil {
			rep.Completed++
		}
	case durable.Failed:
		err = r.c.store.Fail(ctx, *new(TTx), rec.Ref, tok, res.Result)
		if err == nil {
			rep.Failed++
		}
	case "":
		rep.Unknown++
		return nil
	default:
		return fmt.Errorf("claim: resolver returned state %q", res.State)
	}
	return err
}

// Run runs passes every Interval until ctx is done or [Reconciler.Stop] is
// called. It returns nil when stopped.
func (r *Reconciler[TTx]) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	r.mu.Lock()
	if r.stop != nil {
		r.mu.Unlock()
		cancel()
		return errors.New("claim: reconciler already running")
	}
	r.stop, r.stopped = cancel, make(chan struct{})
	stopped := r.stopped
	r.mu.Unlock()
	defer close(stopped)
	defer cancel()
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.c.log.Warn("oncekey: reconcile pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Stop stops a running [Reconciler.Run] and waits for it to return.
func (r *Reconciler[TTx]) Stop() {
	r.mu.Lock()
	stop, stopped := r.stop, r.stopped
	r.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-stopped
}
