package claim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// KeepAlive renews the lease in the background every third of its length,
// counted from when the claim or the previous renewal was sent (a claim or
// renewal that came back later than that is followed by a renewal at once),
// and returns a context for the work, derived from ctx. That context is
// cancelled, with the reason as its cause (context.Cause):
//
//   - [ErrFenced] when a renewal is fenced: another worker took the key
//     over, and the work must not publish its result;
//   - [ErrLeaseExpired] when the lease could not be renewed (the store is
//     unreachable) and only the start margin ([WithStartMargin]) is left of
//     it by [Lease.Deadline]. The deadline is measured from when the claim
//     or the last successful renewal was sent, so it errs early: the work
//     is told to stop before the lease ends by the database's clock, that
//     is before another worker can take the key over, not after.
//
// Stop renewing by calling stop, which returns that reason or nil; call it
// before Complete, Fail, MarkUncertain or Release.
//
// ErrLeaseExpired does not mean the key was lost to someone else: no one may
// have taken it over yet, so a fenced [Lease.Complete] (or Fail, or
// MarkUncertain) may still succeed, and the caller should try it rather
// than give up on recording an effect that may have happened. The renewals
// go on after ErrLeaseExpired, until stop or a fenced renewal: a renewal
// that gets through (a slow one in flight is not cut) keeps the key from a
// takeover while the worker winds down and records its outcome. KeepAlive
// never releases the key: once work started, only the application may
// state that nothing happened.
//
// ctx should not be a request's context when the work must outlive its
// client (a cancelled request would cancel the work and stop the renewals
// while the effect may be half done): pass context.WithoutCancel of it, as
// package claimhttp does, and bound the work by the lease instead.
func (l *Lease) KeepAlive(ctx context.Context) (work context.Context, stop func() error) {
	if l.c.tracer().on() {
		ctx = operationBaggage(ctx, l.OperationID())
	}
	k := &keeper{l: l, interval: max(l.lease/3, time.Millisecond), done: make(chan struct{})}
	// alive ends when stop is called (or ctx ends): the renewals run on
	// it. work, derived from it, also ends when the lease is lost or about
	// to run out; the renewals go on after that, until stop, since the
	// worker still holds the key and is about to record its outcome (a
	// fenced Complete, Fail or MarkUncertain): a renewal that succeeds
	// keeps the key from a takeover meanwhile, and the worker may still
	// be running whatever it did not stop.
	k.alive, k.end = context.WithCancel(ctx)
	k.work, k.cancel = context.WithCancelCause(k.alive)
	go k.run()
	return k.work, k.stop
}

// keeper is one [Lease.KeepAlive]: the renewals that run in the background
// and the work's context they guard.
type keeper struct {
	l *Lease
	// interval is the renewal period: a third of the lease, at least 1ms.
	interval time.Duration

	alive  context.Context    // the renewals' context; ends at stop or with ctx
	end    context.CancelFunc // ends alive
	work   context.Context    // the work's context, derived from alive
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when run has returned

	once   sync.Once // stop's
	mu     sync.Mutex
	reason error // the first cause the work was cancelled with; stop returns it

	// Owned by run's goroutine.
	renew  *time.Timer
	expiry *time.Timer
	// renewed is set while a durable renewal is in flight.
	renewed chan error

	// Redis's copy is renewed after each durable renewal, off the
	// schedule: a slow Redis must not delay the next durable renewal
	// (the lease would lapse for an accelerator). One at a time; a
	// renewal that finds the previous one still running skips it.
	redisBusy atomic.Bool
	redisWG   sync.WaitGroup
}

// run is the renewals' goroutine: it renews the lease on schedule and
// cancels the work when the lease is lost or about to run out, until alive
// ends; it returns once its renewals have ended.
func (k *keeper) run() {
	defer close(k.done)
	k.renew = time.NewTimer(k.nextRenewal())
	defer k.renew.Stop()
	// expiry fires when only the margin is left of the lease by its
	// local deadline. It runs beside the renewals, not after them, so
	// a renewal that hangs cannot delay the cancellation; it is
	// re-armed whenever a renewal (ours, or the caller's Renew) moved
	// the deadline.
	k.expiry = time.NewTimer(max(k.untilExpiry(), 0))
	defer k.expiry.Stop()
	defer k.drain()
	for {
		select {
		case <-k.alive.Done():
			return
		case <-k.expiry.C:
			k.expiryFired()
		case <-k.renew.C:
			k.renewed = make(chan error, 1)
			go k.renewOnce(k.renewed)
		case err := <-k.renewed:
			k.renewed = nil
			if !k.renewalDone(err) {
				return
			}
		}
	}
}

// nextRenewal returns how long until the next renewal is due. Each renewal
// is due interval after the previous one (or the claim) was sent, which is
// when the deadline counts from, not after it came back: a slow claim or a
// slow renewal must not stretch the period, or the lease would lapse.
func (k *keeper) nextRenewal() time.Duration {
	return max(time.Until(k.l.Deadline())-(k.l.lease-k.interval), time.Millisecond)
}

// untilExpiry returns how long until only the start margin is left of the
// lease by its local deadline.
func (k *keeper) untilExpiry() time.Duration { return time.Until(k.l.Deadline()) - k.l.margin }

// expiryFired handles the expiry timer: it re-arms it when a renewal moved
// the deadline, and otherwise tells the work to stop.
func (k *keeper) expiryFired() {
	if d := k.untilExpiry(); d > 0 {
		k.expiry.Reset(d)
		return
	}
	// The work must stop; the renewals go on (a slow one in
	// flight is not cut: it may yet extend the lease).
	k.fail(fmt.Errorf("%w: not renewed in time", ErrLeaseExpired))
}

// renewOnce is one renewal attempt, on a goroutine of its own: the durable
// renewal, then, if it succeeded, Redis's copy beside it. It sends the
// durable renewal's error to ch.
func (k *keeper) renewOnce(ch chan<- error) {
	// Bounded, so a renewal stuck on a dead connection is
	// retried: until the deadline while there is one, then
	// a third of the lease at a time.
	rctx, rcancel := context.WithTimeout(k.alive, max(time.Until(k.l.Deadline()), k.interval))
	err := k.l.renewDurable(rctx)
	rcancel()
	if err == nil && k.redisBusy.CompareAndSwap(false, true) {
		k.redisWG.Add(1)
		go func() {
			defer k.redisWG.Done()
			defer k.redisBusy.Store(false)
			k.l.renewRedis(k.alive)
		}()
	}
	ch <- err
}

// renewalDone acts on the outcome of a durable renewal and reports whether
// the renewals go on: after a success the expiry (unless the work already
// ended) and the next renewal are re-armed; a fenced renewal ends the work
// and the renewals; any other error is retried soon.
func (k *keeper) renewalDone(err error) (goOn bool) {
	switch {
	case err == nil:
		if k.work.Err() == nil {
			k.expiry.Reset(max(k.untilExpiry(), 0))
		}
		k.renew.Reset(k.nextRenewal())
	case errors.Is(err, ErrFenced):
		k.fail(err)
		return false
	default: // the store unreachable: retry soon
		k.renew.Reset(max(k.interval/4, time.Millisecond))
	}
	return true
}

// drain waits, as run returns, for the renewals it started. When stop (or
// ctx) ended alive, their contexts end them; after a fenced renewal only a
// renewal of Redis's copy may still be running, and it is waited for.
func (k *keeper) drain() {
	if k.renewed != nil {
		<-k.renewed // stop ended alive, so its context ended the renewal
	}
	k.redisWG.Wait() // likewise
}

// fail cancels the work with err as its cause, and keeps err as the reason
// stop returns unless an earlier one was kept.
func (k *keeper) fail(err error) {
	k.mu.Lock()
	if k.reason == nil {
		k.reason = err
	}
	k.mu.Unlock()
	k.cancel(err)
}

// stop ends the renewals and waits for them, cancelling the work if it was
// not already, and returns the reason the work was cancelled, or nil if
// only stop cancelled it. It may be called more than once.
func (k *keeper) stop() error {
	k.once.Do(func() {
		k.cancel(context.Canceled)
		k.end()
		<-k.done
	})
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reason
}
