package claimhttp

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// Middleware returns net/http middleware that makes the guarded requests
// of the handlers it wraps execute at most once per tenant, operation and
// idempotency key within the retention window, and replays their stored
// result to every retry. See the package documentation for the protocol
// and what each answer means.
//
// Wrap each route (mux.Handle("POST /orders", mw(h))) so that r.Pattern,
// and so the default operation name, is set when the middleware runs.
//
// It checks opts once and returns [ErrConfig], naming the bad option.
func Middleware[TTx any](c *claim.Claimer[TTx], opts Options) (func(http.Handler) http.Handler, error) {
	if c == nil {
		return nil, configErr("nil Claimer")
	}
	o, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	m := &middleware[TTx]{c: c, o: o}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("claimhttp: Middleware applied to a nil handler")
		}
		return &guarded[TTx]{m: m, next: next}
	}, nil
}

type middleware[TTx any] struct {
	c *claim.Claimer[TTx]
	o resolved
}

type guarded[TTx any] struct {
	m    *middleware[TTx]
	next http.Handler
}

// ServeHTTP runs the checks that reserve nothing (key, tenant, fingerprint),
// then the claim, then the handler.
func (g *guarded[TTx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := g.m
	if !m.o.methods[r.Method] {
		g.next.ServeHTTP(w, r)
		return
	}
	key, keyErr := ParseKey(r.Header, m.o.Header)
	if errors.Is(keyErr, ErrKeyMissing) && m.optional(r) {
		g.next.ServeHTTP(w, r)
		return
	}
	operation := g.operation(r)
	if operation != "" {
		secs := int64(m.c.RetentionFor(operation) / time.Second)
		w.Header().Set(HeaderRetention, strconv.FormatInt(secs, 10))
	}
	switch {
	case errors.Is(keyErr, ErrKeyMissing):
		writeProblem(w, http.StatusBadRequest, ProblemKeyMissing, "This request requires an "+m.o.Header+" field.", "", 0)
		return
	case keyErr != nil:
		writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid, "The "+m.o.Header+" field must appear once and hold one quoted string or bare key of 1 to 255 printable ASCII characters.", "", 0)
		return
	case operation == "":
		m.o.Logger.Error("claimhttp: OperationFunc returned an empty operation")
		writeProblem(w, http.StatusInternalServerError, ProblemInternal, "The operation could not be named.", "", 0)
		return
	}
	tenant, err := m.o.TenantFunc(r)
	if err != nil || tenant == "" {
		writeProblem(w, http.StatusUnauthorized, ProblemUnidentified, "The caller could not be identified.", "", 0)
		return
	}
	scope := durable.Scope{Tenant: tenant, Operation: operation, Key: key}
	if err := scope.Validate(); err != nil {
		var se *durable.ScopeError
		errors.As(err, &se)
		m.o.Logger.Error("claimhttp: invalid scope from TenantFunc or OperationFunc", "field", se.Field, "reason", se.Reason)
		writeProblem(w, http.StatusInternalServerError, ProblemInternal, "The request could not be scoped.", "", 0)
		return
	}
	copts := m.o.Canon
	copts.Operation = operation
	fp, err := canon.Request(r, copts)
	switch {
	case errors.Is(err, canon.ErrTooLarge):
		writeProblem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "The request body is larger than this endpoint accepts.", "", 0)
		return
	case errors.Is(err, canon.ErrInvalidOptions):
		m.o.Logger.Error("claimhttp: fingerprint options", "err", err)
		writeProblem(w, http.StatusInternalServerError, ProblemInternal, "The request could not be fingerprinted.", "", 0)
		return
	case err != nil:
		writeProblem(w, http.StatusBadRequest, ProblemBodyInvalid, "The request body could not be read or canonicalized.", "", 0)
		return
	}
	req := claim.Request{Scope: scope, Fingerprint: string(fp)}
	if m.o.InTransaction {
		g.serveTx(w, r, req)
	} else {
		g.serveWorkflow(w, r, req)
	}
}

func (m *middleware[TTx]) optional(r *http.Request) bool {
	if m.o.OptionalFunc != nil {
		return m.o.OptionalFunc(r)
	}
	return m.o.Optional
}

func (g *guarded[TTx]) operation(r *http.Request) string {
	if g.m.o.OperationFunc != nil {
		return g.m.o.OperationFunc(r)
	}
	return defaultOperation(r)
}

// serveTx runs the handler inside claim.Do.
func (g *guarded[TTx]) serveTx(w http.ResponseWriter, r *http.Request, req claim.Request) {
	m := g.m
	var cw *capture
	out, err := m.c.Do(r.Context(), req, func(ctx context.Context, tx TTx, op claim.Op) (durable.Result, error) {
		ctx = context.WithValue(ctx, txKey[TTx]{}, tx)
		ctx = withOp(ctx, &opInfo{id: op.ID, token: op.Token})
		cw = newCapture(w, m.o.MaxResponseBody)
		// A panic propagates through Do, which rolls the transaction back
		// (the key was never durably taken) and re-panics.
		g.next.ServeHTTP(cw, r.WithContext(ctx))
		cw.finish()
		if cw.err != nil {
			return durable.Result{}, errRelease
		}
		res := cw.result(m.o.stored, m.o.MaxStoredBody)
		switch m.o.StatusFunc(cw.status) {
		case StoreCompleted:
			return res, nil
		case StoreFailed:
			return durable.Result{}, claim.Reject(res)
		default:
			return durable.Result{}, errRelease
		}
	})
	switch {
	case errors.Is(err, errRelease):
		if cw.err != nil {
			m.tooLarge(w, out.OperationID)
			return
		}
		cw.publish(w) // rolled back: nothing stored, the key is free
	case err != nil:
		m.claimError(w, out.OperationID, err)
	case out.Kind == claim.Executed:
		cw.publish(w) // committed
	default:
		m.outcome(w, out)
	}
}

// serveWorkflow claims, runs the handler under a kept-alive lease, then
// completes, fails, releases or marks the lease uncertain.
func (g *guarded[TTx]) serveWorkflow(w http.ResponseWriter, r *http.Request, req claim.Request) {
	m := g.m
	out, err := m.c.Claim(r.Context(), req)
	if err != nil {
		m.claimError(w, out.OperationID, err)
		return
	}
	if out.Kind != claim.Acquired {
		m.outcome(w, out)
		return
	}
	lease := out.Lease
	opID := out.OperationID
	work, stop := lease.KeepAlive(r.Context())
	op := &opInfo{id: opID, token: lease.Token(), workflow: true}
	cw := newCapture(w, m.o.MaxResponseBody)

	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked (or called runtime.Goexit): give the key
		// back, and let the panic continue with its own stack.
		_ = stop()
		ctx, cancel := m.finishCtx(r)
		defer cancel()
		if err := lease.Release(ctx); err != nil {
			m.o.Logger.Warn("claimhttp: release after a handler panic failed; the lease will expire", "op", opID, "err", err)
		}
	}()
	g.next.ServeHTTP(cw, r.WithContext(withOp(work, op)))
	finished = true
	cw.finish()

	lost := stop()
	ctx, cancel := m.finishCtx(r)
	defer cancel()
	if lost != nil {
		m.leaseLost(w, opID, lost)
		if !errors.Is(lost, claim.ErrFenced) {
			_ = lease.Release(ctx) // best effort: the lease expired unrenewed
		}
		return
	}
	if op.uncertain.Load() {
		if err := lease.MarkUncertain(ctx); err != nil {
			m.finishError(w, opID, "mark uncertain", err)
			return
		}
		m.uncertain(w, opID)
		return
	}
	if cw.err != nil {
		m.release(ctx, lease, opID)
		m.tooLarge(w, opID)
		return
	}
	res := cw.result(m.o.stored, m.o.MaxStoredBody)
	var step string
	switch m.o.StatusFunc(cw.status) {
	case StoreCompleted:
		step, err = "complete", retryUnavailable(ctx, func() error { return lease.Complete(ctx, res) })
	case StoreFailed:
		step, err = "fail", retryUnavailable(ctx, func() error { return lease.Fail(ctx, res) })
	default:
		m.release(ctx, lease, opID)
		cw.publish(w)
		return
	}
	if err != nil {
		m.finishError(w, opID, step, err)
		return
	}
	cw.publish(w)
}

// retryUnavailable runs a fenced finishing write up to three times while it
// fails with ErrUnavailable: such a write is safe to repeat (the same token
// and result), and each failure leaves its outcome unknown.
func retryUnavailable(ctx context.Context, f func() error) error {
	var err error
	for i := range 3 {
		if err = f(); err == nil || !errors.Is(err, claim.ErrUnavailable) {
			return err
		}
		t := time.NewTimer(time.Duration(i+1) * 50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
	return err
}

func (m *middleware[TTx]) finishCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), m.o.FinishTimeout)
}

func (m *middleware[TTx]) release(ctx context.Context, lease *claim.Lease[TTx], opID string) {
	if err := lease.Release(ctx); err != nil {
		m.o.Logger.Warn("claimhttp: release failed; the lease will expire", "op", opID, "err", err)
	}
}

// outcome answers a claim that did not run the handler.
func (m *middleware[TTx]) outcome(w http.ResponseWriter, out claim.Outcome[TTx]) {
	switch out.Kind {
	case claim.Replayed:
		if out.Result == nil { // not produced by the claim package; fail safe
			m.inProgress(w, out.OperationID, m.o.RetryAfter)
			return
		}
		replay(w, out.Result)
	case claim.Uncertain:
		m.uncertain(w, out.OperationID)
	default: // InProgress
		m.inProgress(w, out.OperationID, out.RetryAfter)
	}
}

func (m *middleware[TTx]) inProgress(w http.ResponseWriter, opID string, holder time.Duration) {
	retry := m.o.RetryAfter
	if holder > 0 {
		retry = min(retry, holder)
	}
	if m.c.Policy().Polls() {
		w.Header().Set("Location", m.o.OperationPath+opID)
		writeProblem(w, http.StatusAccepted, ProblemInProgress, "A request with this key is still being processed; poll the Location or retry the request.", opID, retry)
		return
	}
	writeProblem(w, http.StatusConflict, ProblemInProgress, "A request with this key is still being processed; retry after the Retry-After delay.", opID, retry)
}

func (m *middleware[TTx]) uncertain(w http.ResponseWriter, opID string) {
	w.Header().Set("Location", m.o.OperationPath+opID)
	writeProblem(w, http.StatusAccepted, ProblemUncertain, "The outcome of the request with this key is not known yet and is being reconciled; it will not run again.", opID, m.o.RetryAfter)
}

func (m *middleware[TTx]) unavailable(w http.ResponseWriter) {
	writeProblem(w, http.StatusServiceUnavailable, ProblemUnavailable, "The request was not processed; retry after the Retry-After delay.", "", m.o.RetryAfter)
}

func (m *middleware[TTx]) tooLarge(w http.ResponseWriter, opID string) {
	m.o.Logger.Error("claimhttp: handler wrote more than MaxResponseBody; key released", "op", opID)
	writeProblem(w, http.StatusInternalServerError, ProblemInternal, "The response could not be produced.", "", 0)
}

// claimError answers an error from Claim or Do. The handler's result was
// not published; for ErrUnavailable it did not run.
func (m *middleware[TTx]) claimError(w http.ResponseWriter, opID string, err error) {
	switch {
	case errors.Is(err, claim.ErrMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused, "This key was already used for a different request.", "", 0)
	case errors.Is(err, claim.ErrUnavailable), errors.Is(err, claim.ErrLeaseExpired):
		m.unavailable(w)
	default:
		m.o.Logger.Error("claimhttp: claim failed", "op", opID, "err", err)
		writeProblem(w, http.StatusInternalServerError, ProblemInternal, "The request could not be processed.", "", 0)
	}
}

// leaseLost answers a workflow handler whose lease ended while it ran: its
// result must not be published.
func (m *middleware[TTx]) leaseLost(w http.ResponseWriter, opID string, reason error) {
	if errors.Is(reason, claim.ErrFenced) {
		m.o.Logger.Warn("claimhttp: lease lost to another worker; response discarded", "op", opID)
		m.inProgress(w, opID, m.o.RetryAfter)
		return
	}
	m.o.Logger.Warn("claimhttp: lease expired unrenewed; response discarded", "op", opID, "err", reason)
	m.unavailable(w)
}

// finishError answers a failed complete, fail or mark-uncertain: the
// response is never published without its durable record.
//
//   - ErrFenced: another worker took the key over. The answer is 409
//     in progress (202 under the Poll policy), which is what a retry will
//     see until the new owner finishes.
//   - anything else (the store is unreachable): 503. The record may or may
//     not hold the result; a retry replays it or, once the lease expires,
//     runs again under a new generation.
func (m *middleware[TTx]) finishError(w http.ResponseWriter, opID, step string, err error) {
	if errors.Is(err, claim.ErrFenced) {
		m.o.Logger.Warn("claimhttp: fenced "+step+"; response discarded", "op", opID)
		m.inProgress(w, opID, m.o.RetryAfter)
		return
	}
	m.o.Logger.Error("claimhttp: "+step+" failed; response discarded", "op", opID, "err", err)
	m.unavailable(w)
}
