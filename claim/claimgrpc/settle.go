package claimgrpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// settleKind is the outcome the interceptor records for a handler that has
// started.
type settleKind int

const (
	settleComplete settleKind = iota + 1
	settleFail
	settleUncertain
	settleRelease // only on the application's word that nothing happened
)

func (k settleKind) String() string {
	switch k {
	case settleComplete:
		return "complete"
	case settleFail:
		return "fail"
	case settleUncertain:
		return "mark uncertain"
	case settleRelease:
		return "release"
	}
	return fmt.Sprintf("settlement(%d)", int(k))
}

// settlement is one durable finishing write.
type settlement struct {
	kind settleKind
	res  durable.Result // complete and fail
}

func apply(ctx context.Context, l *claim.Lease, s settlement) error {
	switch s.kind {
	case settleComplete:
		return l.Complete(ctx, s.res)
	case settleFail:
		return l.Fail(ctx, s.res)
	case settleUncertain:
		return l.MarkUncertain(ctx)
	case settleRelease:
		return l.Release(ctx) // only ever from ReleaseKey: see settlementFor
	}
	return fmt.Errorf("claimgrpc: unknown settlement %d", s.kind)
}

// settlementFor decides what becomes of a handler's answer. An uncertain
// mark wins over everything; a release happens only when the handler called
// ReleaseKey; every answer is stored otherwise: a reply as completed, an
// error status (whatever its code) as failed, since the handler may have
// acted before it failed. A reply that cannot be stored (not a protobuf
// message) is recorded uncertain, and the error says why.
func settlementFor(op *opInfo, resp any, herr error) (settlement, error) {
	switch {
	case op.uncertain.Load():
		return settlement{kind: settleUncertain}, nil
	case op.released.Load():
		return settlement{kind: settleRelease}, nil
	}
	res, failed, err := encodeReply(resp, herr)
	switch {
	case err != nil:
		return settlement{kind: settleUncertain}, err
	case failed:
		return settlement{kind: settleFail, res: res}, nil
	}
	return settlement{kind: settleComplete, res: res}, nil
}

// errPending reports a settlement that could not be written within
// FinishTimeout because the store stayed unreachable.
var errPending = errors.New("claimgrpc: outcome not recorded within FinishTimeout")

// settle writes s, fenced by the lease, while renewals go on, retrying
// while the store is unavailable for up to FinishTimeout; stop (the
// KeepAlive's) is called once it is settled either way. ctx is detached
// from the call's cancellation. A write still unavailable then returns
// errPending, and the interceptor goes on in the background (renewing,
// retrying) until the write succeeds, is fenced, or the lease has run out:
// the record stays processing under its lease meanwhile, retries see it in
// progress, and if the store comes back within the lease the outcome is
// recorded and nothing runs again. Only a store outage longer than the
// lease leaves the record to a takeover, as a crash would.
func (s *server[TTx]) settle(ctx context.Context, l *claim.Lease, stop func() error, opID string, st settlement) error {
	actx, cancel := context.WithTimeout(ctx, s.o.finishTimeout)
	err := retryUnavailable(actx, func() error { return apply(actx, l, st) })
	cancel()
	if err == nil || !errors.Is(err, claim.ErrUnavailable) {
		_ = stop()
		return err
	}
	if st.kind == settleRelease {
		// Nothing happened by the application's word: the lease may just
		// expire.
		_ = stop()
		return errPending
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { _ = stop() }()
		s.settleLater(ctx, l, opID, st)
	}()
	return errPending
}

// settleLater retries st until it succeeds, is fenced, fails for another
// reason, or the lease has run out by this process's clock (which errs
// early; a last attempt is still made then, since a fenced write is safe at
// any time).
func (s *server[TTx]) settleLater(ctx context.Context, l *claim.Lease, opID string, st settlement) {
	backoff := 100 * time.Millisecond
	for {
		last := time.Now().After(l.Deadline())
		actx, cancel := context.WithTimeout(ctx, s.o.finishTimeout)
		err := apply(actx, l, st)
		cancel()
		switch {
		case err == nil:
			s.o.logger.Info("claimgrpc: outcome recorded after the answer", "op", opID, "step", st.kind.String())
			return
		case !errors.Is(err, claim.ErrUnavailable):
			s.o.logger.Warn("claimgrpc: "+st.kind.String()+" after the answer failed", "op", opID, "err", err)
			return
		case last:
			s.o.logger.Error("claimgrpc: the lease ran out before the outcome could be recorded; a retry may take the operation over", "op", opID, "step", st.kind.String())
			return
		}
		t := time.NewTimer(min(backoff, max(time.Until(l.Deadline()), time.Millisecond)))
		<-t.C
		backoff = min(backoff*2, 2*time.Second)
	}
}

// retryUnavailable runs a fenced finishing write while it fails with
// ErrUnavailable and ctx allows: such a write is safe to repeat (the same
// token and result), and each failure leaves its outcome unknown.
func retryUnavailable(ctx context.Context, f func() error) error {
	backoff := 25 * time.Millisecond
	for {
		err := f()
		if err == nil || !errors.Is(err, claim.ErrUnavailable) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(backoff*2, time.Second)
	}
}
