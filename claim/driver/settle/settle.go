// Package settle is the one settlement of started work that every entry
// point of the project (claimhttp, claimgrpc, the message consumers,
// claimriver) goes through.
//
// Once a handler has started under a [claim.Lease], its effect may have
// happened. From then on the engine only completes, fails or marks the
// record uncertain; it releases the key only on the application's explicit
// word that nothing happened ([Op.Release]). It:
//
//   - renews the lease while the work runs, detached from the caller's
//     cancellation (the work of an idempotent request outlives its client);
//   - recovers a panic (or runtime.Goexit) into "uncertain", records it, and
//     lets the panic go on;
//   - retries the completion, failure or mark-uncertain while the store is
//     unavailable, with backoff, for as long as the lease lasts: first for
//     up to [Engine.Handoff] before it answers, then in the background;
//   - hands the outcome to the transport only once it is recorded (or is
//     still being recorded, [ErrPending]).
//
// The adapters only translate: their transport's request into a claim,
// the handler's answer into a [Settlement], and a [Report] into their
// transport's answer.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package settle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/logkeys"
	"github.com/oncekey/oncekey/internal/settlemode"
)

// Kind is the durable outcome a settlement records.
type Kind int

const (
	// Complete stores the result as completed.
	Complete Kind = iota + 1
	// Fail stores the result as a final business rejection.
	Fail
	// Uncertain records that the outcome is unknown: a Reconciler or an
	// operator decides.
	Uncertain
	// Release gives the key back. Only ever on the application's word
	// ([Op.Release]): the engine never assumes that nothing happened.
	Release
)

func (k Kind) String() string {
	switch k {
	case Complete:
		return "complete"
	case Fail:
		return "fail"
	case Uncertain:
		return "mark uncertain"
	case Release:
		return "release"
	}
	return fmt.Sprintf("settle.Kind(%d)", int(k))
}

// Settlement is one durable finishing write.
type Settlement struct {
	Kind   Kind
	Result durable.Result // Complete and Fail
}

// Op is what a handler run by the engine can learn of its operation and
// tell the engine. It travels in the handler's context ([From]).
type Op struct {
	ID    string
	Token fence.Token
	// InTx is set for a handler that runs inside the claim's transaction
	// (claim.Claimer.Do), not under a lease: it makes no external call, so
	// it has no uncertain outcome; a release rolls the transaction back.
	InTx bool

	lease     *claim.Lease // nil in a transaction (InTx)
	uncertain atomic.Bool
	released  atomic.Bool
}

// NewOp returns the Op of the operation l holds.
func NewOp(l *claim.Lease) *Op { return &Op{ID: l.OperationID(), Token: l.Token(), lease: l} }

// MarkUncertain records that the handler's outcome is unknown; it wins over
// everything the handler returns.
func (o *Op) MarkUncertain() { o.uncertain.Store(true) }

// Release records the application's word that the handler had no effect,
// so the key may run again. MarkUncertain wins over it.
func (o *Op) Release() { o.released.Store(true) }

// Uncertain reports whether MarkUncertain was called.
func (o *Op) Uncertain() bool { return o.uncertain.Load() }

// Released reports whether Release was called (and MarkUncertain was not).
func (o *Op) Released() bool { return o.released.Load() && !o.uncertain.Load() }

type opKey struct{}

// With returns ctx carrying op.
func With(ctx context.Context, op *Op) context.Context { return context.WithValue(ctx, opKey{}, op) }

// From returns the Op in ctx, nil outside a handler run by the engine (or
// an adapter's own handler context).
func From(ctx context.Context) *Op {
	op, _ := ctx.Value(opKey{}).(*Op)
	return op
}

// ErrPending reports a settlement that was not recorded within
// [Engine.Handoff]: the engine goes on recording it in the background,
// renewing the lease, until it is recorded, fenced, or the lease has run
// out. The record stays processing meanwhile, and every retry sees it in
// progress: the transport must not answer "not processed".
var ErrPending = errors.New("settle: outcome not recorded yet; still being recorded")

// ErrLeaseRanOut reports a settlement that could not be recorded before the
// lease ran out (the store stayed unreachable). The record stays
// processing; after the lease a takeover or a Reconciler decides, as after
// a crash.
var ErrLeaseRanOut = errors.New("settle: the lease ran out before the outcome could be recorded")

// Engine settles started work. The zero value is not usable: set Name.
type Engine struct {
	// Name prefixes log lines ("claimhttp").
	Name string
	// Logger receives the engine's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// Handoff bounds how long Run waits for the settlement to be recorded
	// before it returns ErrPending and goes on in the background. Zero
	// waits until it is recorded or the lease has run out (a consumer that
	// must not acknowledge before).
	Handoff time.Duration
	// Attempt bounds one finishing write. Defaults to Handoff, or 5s
	// without one.
	Attempt time.Duration
	// Release writes a Release settlement, the application's word that
	// nothing happened. Nil is claim.Lease.Release, which frees the key for
	// any new claim. An adapter whose transport runs the same operation
	// again on its own (claimriver: River's retry of the job, which carries
	// no key to claim with) ends the lease instead, keeping the record
	// processing for that run to adopt. The renewals stop before it runs.
	Release func(ctx context.Context, l *claim.Lease) error

	wg sync.WaitGroup
}

// Wait waits for the settlements still going on in the background.
func (e *Engine) Wait() { e.wg.Wait() }

func (e *Engine) logger() *slog.Logger {
	if e.Logger != nil {
		return e.Logger
	}
	return slog.Default()
}

func (e *Engine) attempt() time.Duration {
	switch {
	case e.Attempt > 0:
		return e.Attempt
	case e.Handoff > 0:
		return e.Handoff
	}
	return 5 * time.Second
}

// Report is what became of started work.
type Report struct {
	// Settlement is what was recorded (or is being recorded).
	Settlement Settlement
	// Lost is claim.ErrFenced when the lease was lost to another worker
	// while the work ran: nothing was written, and the work's answer must
	// not be published (the other worker's outcome is the operation's).
	Lost error
	// Err is nil when Settlement is recorded; ErrPending while it is
	// still being recorded; ErrLeaseRanOut; an error matching
	// claim.ErrFenced when the write was fenced (publish nothing); or the
	// store's other error.
	Err error
}

// Run runs work under l, with op in its context, on a context detached
// from ctx's cancellation (its values are kept) that ends only when the
// lease is lost or about to run out (see claim.Lease.KeepAlive). work
// returns the settlement its answer calls for; op's marks override it
// (uncertain wins, then release).
//
// When work panics, or calls runtime.Goexit, Run records the outcome as
// uncertain (released if the application said nothing happened), waiting
// for it as Handoff says, then lets the panic go on.
func (e *Engine) Run(ctx context.Context, l *claim.Lease, op *Op, work func(ctx context.Context) Settlement) Report {
	detached := context.WithoutCancel(ctx)
	wctx, stop := l.KeepAlive(detached)
	if brokenMode() == settlemode.NoRecover {
		s := work(With(wctx, op))
		return e.finish(detached, l, op, wctx, stop, s)
	}
	returned := false
	defer func() {
		if returned {
			return
		}
		// The handler panicked (or called runtime.Goexit) after it
		// started: its effect may have happened.
		s := Settlement{Kind: Uncertain}
		if op.Released() {
			s.Kind = Release
		}
		r := e.settle(detached, l, stop, op.ID, s)
		if r.Err != nil {
			e.logger().Error(e.Name+": handler panicked; its outcome could not be recorded yet", logkeys.Op, op.ID, logkeys.Err, r.Err)
		} else {
			e.logger().Error(e.Name+": handler panicked; outcome recorded as "+s.Kind.String(), logkeys.Op, op.ID)
		}
		// recover() is not called: the panic goes on with its own stack.
	}()
	s := work(With(wctx, op))
	returned = true
	return e.finish(detached, l, op, wctx, stop, s)
}

func (e *Engine) finish(ctx context.Context, l *claim.Lease, op *Op, wctx context.Context, stop func() error, s Settlement) Report {
	if errors.Is(context.Cause(wctx), claim.ErrFenced) {
		// Another worker took the key over after our lease expired: its
		// outcome is the operation's; ours must not be published.
		_ = stop()
		e.logger().Warn(e.Name+": lease lost to another worker; answer discarded", logkeys.Op, op.ID)
		return Report{Settlement: s, Lost: claim.ErrFenced}
	}
	switch {
	case op.Uncertain():
		s = Settlement{Kind: Uncertain}
	case op.Released():
		s = Settlement{Kind: Release}
	}
	if s.Kind < Complete || s.Kind > Release {
		s = Settlement{Kind: Uncertain} // an adapter's bug must not release
	}
	if brokenMode() == settlemode.ReleaseOnError && s.Kind != Complete {
		s = Settlement{Kind: Release}
	}
	// A lease that ran out unrenewed (the store refused renewals) is not
	// lost until someone takes it over: the fenced write still succeeds if
	// no one has.
	return e.settle(ctx, l, stop, op.ID, s)
}

// settle writes s, fenced by the lease, while the renewals go on, retrying
// while the store is unavailable: for up to Handoff (or the lease) before
// it returns, then in the background until the lease has run out. stop
// (the KeepAlive's) is called once it is settled either way.
func (e *Engine) settle(ctx context.Context, l *claim.Lease, stop func() error, opID string, s Settlement) Report {
	if brokenMode() == settlemode.OneAttempt {
		_ = stop()
		actx, cancel := context.WithTimeout(ctx, e.attempt())
		err := e.apply(actx, l, s)
		cancel()
		return Report{Settlement: s, Err: err}
	}
	if s.Kind == Release {
		// Nothing happened: the lease may lapse, and a renewal must not
		// extend it past a release that ends it (Engine.Release).
		_ = stop()
	}
	var err error
	if e.Handoff > 0 {
		end := time.Now().Add(e.Handoff)
		hctx, cancel := context.WithDeadline(ctx, end)
		err = e.retry(hctx, l, s, func() time.Time { return end })
		cancel()
	} else {
		err = e.retry(ctx, l, s, l.Deadline)
	}
	if err == nil || !errors.Is(err, claim.ErrUnavailable) {
		_ = stop()
		return Report{Settlement: s, Err: err}
	}
	if s.Kind == Release {
		// Nothing happened by the application's word: the lease may just
		// expire, and the key runs again after it.
		_ = stop()
		return Report{Settlement: s, Err: ErrPending}
	}
	if e.Handoff <= 0 {
		_ = stop()
		e.logger().Error(e.Name+": the lease ran out before the outcome could be recorded; a retry may take the operation over", logkeys.Op, opID, logkeys.Step, s.Kind.String())
		return Report{Settlement: s, Err: ErrLeaseRanOut}
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() { _ = stop() }()
		err := e.retry(ctx, l, s, l.Deadline)
		switch {
		case err == nil:
			e.logger().Info(e.Name+": outcome recorded after the answer", logkeys.Op, opID, logkeys.Step, s.Kind.String())
		case errors.Is(err, claim.ErrUnavailable):
			e.logger().Error(e.Name+": the lease ran out before the outcome could be recorded; a retry may take the operation over", logkeys.Op, opID, logkeys.Step, s.Kind.String())
		default:
			e.logger().Warn(e.Name+": "+s.Kind.String()+" after the answer failed", logkeys.Op, opID, logkeys.Err, err)
		}
	}()
	return Report{Settlement: s, Err: ErrPending}
}

// retry writes s while it fails with ErrUnavailable, until until() has
// passed by this process's clock (which errs early for the lease's
// deadline); one last attempt is made then, since a fenced write is safe at
// any time. Such a write is safe to repeat (the same token and result),
// and each failure leaves its outcome unknown.
func (e *Engine) retry(ctx context.Context, l *claim.Lease, s Settlement, until func() time.Time) error {
	backoff := 25 * time.Millisecond
	for {
		last := !time.Now().Before(until())
		actx, cancel := context.WithTimeout(ctx, e.attempt())
		err := e.apply(actx, l, s)
		cancel()
		if err == nil || !errors.Is(err, claim.ErrUnavailable) || last {
			return err
		}
		wait := min(backoff, max(time.Until(until()), time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(backoff*2, time.Second)
	}
}

func (e *Engine) apply(ctx context.Context, l *claim.Lease, s Settlement) error {
	switch s.Kind {
	case Complete:
		return l.Complete(ctx, s.Result)
	case Fail:
		return l.Fail(ctx, s.Result)
	case Uncertain:
		return l.MarkUncertain(ctx)
	case Release: // only on the application's word: see finish
		if e.Release != nil {
			return e.Release(ctx, l)
		}
		return l.Release(ctx)
	}
	return fmt.Errorf("settle: unknown settlement %d", s.Kind)
}
