package claimhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// settleKind is the outcome the middleware records for a workflow-mode
// handler that has started.
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
	return fmt.Errorf("claimhttp: unknown settlement %d", s.kind)
}

// settlementFor decides what becomes of a handler's response. An uncertain
// mark wins over everything; a release happens only when the handler
// called ReleaseKey; every response is stored otherwise (workflowStatus). A
// response over MaxResponseBody is stored by its status without its body,
// as one over MaxStoredBody is.
func (m *middleware[TTx]) settlementFor(op *opInfo, cw *capture) settlement {
	switch {
	case op.uncertain.Load():
		return settlement{kind: settleUncertain}
	case op.released.Load():
		return settlement{kind: settleRelease}
	}
	maxStored := m.o.maxStoredBody
	if cw.err != nil {
		maxStored = -1 // omit the body: it was never whole
	}
	res := cw.result(m.o.stored, maxStored)
	if workflowStatus(cw.status) == storeCompleted {
		return settlement{kind: settleComplete, res: res}
	}
	return settlement{kind: settleFail, res: res}
}

// errPending reports a settlement that could not be written within
// FinishTimeout because the store stayed unreachable.
var errPending = errors.New("claimhttp: outcome not recorded within FinishTimeout")

// settle writes s, fenced by the lease, while renewals go on, retrying
// while the store is unavailable for up to FinishTimeout; stop (the
// KeepAlive's) is called once it is settled either way. A write that is
// still unavailable then returns errPending, and the middleware goes on in
// the background (renewing, retrying) until the write succeeds, is fenced,
// or the lease has run out: the record stays processing under its lease
// meanwhile, retries see it in progress, and if the store comes back
// within the lease the outcome is recorded and nothing runs again. Only a
// store outage longer than the lease leaves the record to a takeover, as a
// crash would.
func (m *middleware[TTx]) settle(r *http.Request, l *claim.Lease, stop func() error, opID string, s settlement) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.o.finishTimeout)
	err := retryUnavailable(ctx, func() error { return apply(ctx, l, s) })
	cancel()
	if err == nil || !errors.Is(err, claim.ErrUnavailable) {
		_ = stop()
		return err
	}
	if s.kind == settleRelease {
		// Nothing happened by the application's word: the lease may just
		// expire.
		_ = stop()
		return errPending
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() { _ = stop() }()
		m.settleLater(context.WithoutCancel(r.Context()), l, opID, s)
	}()
	return errPending
}

// settleLater retries s until it succeeds, is fenced, fails for another
// reason, or the lease has run out by this process's clock (which errs
// early; a last attempt is still made then, since a fenced write is safe at
// any time).
func (m *middleware[TTx]) settleLater(ctx context.Context, l *claim.Lease, opID string, s settlement) {
	backoff := 100 * time.Millisecond
	for {
		last := time.Now().After(l.Deadline())
		actx, cancel := context.WithTimeout(ctx, m.o.finishTimeout)
		err := apply(actx, l, s)
		cancel()
		switch {
		case err == nil:
			m.o.logger.Info("claimhttp: outcome recorded after the answer", "op", opID, "step", s.kind.String())
			return
		case !errors.Is(err, claim.ErrUnavailable):
			m.o.logger.Warn("claimhttp: "+s.kind.String()+" after the answer failed", "op", opID, "err", err)
			return
		case last:
			m.o.logger.Error("claimhttp: the lease ran out before the outcome could be recorded; a retry may take the operation over", "op", opID, "step", s.kind.String())
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
