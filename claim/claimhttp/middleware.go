package claimhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/driver/problem"
	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/wire"
	"github.com/oncekey/oncekey/internal/logkeys"
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
// tenant returns the authenticated caller of r, typically read from the
// principal an authentication middleware put in r's context. It is
// required: there is no default, and none that trusts a client header. An
// error or an empty tenant answers 401 (ProblemUnidentified) before
// anything is claimed.
//
// It checks opts once and returns [ErrConfig], naming the bad option.
func Middleware[TTx any](c *claim.Claimer[TTx], tenant func(r *http.Request) (string, error), opts ...Option) (func(http.Handler) http.Handler, error) {
	if c == nil {
		return nil, configErr("nil Claimer")
	}
	o, err := newConfig(tenant, opts)
	if err != nil {
		return nil, err
	}
	if err := c.Driver().CheckLease("WithLease", "", o.lease); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	m := &middleware[TTx]{c: c, o: o,
		settle: o.Engine("claimhttp")}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("claimhttp: Middleware applied to a nil handler")
		}
		return &guarded[TTx]{m: m, next: next}
	}, nil
}

type middleware[TTx any] struct {
	c      *claim.Claimer[TTx]
	o      config
	settle *settle.Engine // the one settlement of started work
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
	key, keyErr := wire.ParseKey(r.Header, m.o.header)
	if errors.Is(keyErr, wire.ErrKeyMissing) && m.optional(r) {
		g.next.ServeHTTP(w, r)
		return
	}
	operation := g.operation(r)
	if operation != "" {
		secs := int64(m.c.Driver().Retention(operation) / time.Second)
		w.Header().Set(claimclient.HeaderRetention, strconv.FormatInt(secs, 10))
	}
	switch {
	case errors.Is(keyErr, wire.ErrKeyMissing):
		writeProblem(w, http.StatusBadRequest, claimclient.ProblemKeyMissing, "This request requires an "+m.o.header+" field.", "", 0)
		return
	case keyErr != nil:
		writeProblem(w, http.StatusBadRequest, claimclient.ProblemKeyInvalid, "The "+m.o.header+" field must appear once and hold one quoted string or bare key of 1 to 255 printable ASCII characters.", "", 0)
		return
	case operation == "" && m.o.operation == nil:
		m.o.Logger.Error("claimhttp: no route pattern to name the operation by: wrap each route of net/http's ServeMux, or use WithOperation with your router's pattern")
		writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The operation could not be named.", "", 0)
		return
	case operation == "":
		m.o.Logger.Error("claimhttp: the WithOperation function returned an empty operation")
		writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The operation could not be named.", "", 0)
		return
	}
	tenant, err := m.o.tenant(r)
	if err != nil || tenant == "" {
		writeProblem(w, http.StatusUnauthorized, claimclient.ProblemUnidentified, problem.DetailUnidentified, "", 0)
		return
	}
	scope := durable.Scope{Tenant: tenant, Operation: operation, Key: key}
	if err := scope.Validate(); err != nil {
		m.o.Logger.Error("claimhttp: invalid scope from the tenant or operation function", logkeys.Err, err)
		writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The request could not be scoped.", "", 0)
		return
	}
	copts := m.o.canonOpts
	copts.Operation = operation
	fp, err := canon.Request(r, copts)
	switch {
	case errors.Is(err, canon.ErrTooLarge):
		writeProblem(w, http.StatusRequestEntityTooLarge, claimclient.ProblemBodyTooLarge, problem.DetailTooLarge, "", 0)
		return
	case errors.Is(err, canon.ErrConfig):
		m.o.Logger.Error("claimhttp: fingerprint options", logkeys.Err, err)
		writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The request could not be fingerprinted.", "", 0)
		return
	case err != nil:
		writeProblem(w, http.StatusBadRequest, claimclient.ProblemBodyInvalid, problem.DetailBodyInvalid, "", 0)
		return
	}
	req := claim.Request{Scope: scope, Fingerprint: string(fp), Lease: m.o.lease}
	if m.o.inTransaction {
		g.serveTx(w, r, req)
	} else {
		g.serveWorkflow(w, r, req)
	}
}

func (m *middleware[TTx]) optional(r *http.Request) bool {
	return m.o.optional != nil && m.o.optional(r)
}

func (g *guarded[TTx]) operation(r *http.Request) string {
	if g.m.o.operation != nil {
		return g.m.o.operation(r)
	}
	return defaultOperation(r)
}

// serveTx runs the handler inside claim.Do.
func (g *guarded[TTx]) serveTx(w http.ResponseWriter, r *http.Request, req claim.Request) {
	m := g.m
	var (
		cw   *capture
		txOp *settle.Op
	)
	out, err := m.c.Do(r.Context(), req, func(ctx context.Context, tx TTx, op claim.Op) (durable.Result, error) {
		ctx = context.WithValue(ctx, txKey[TTx]{}, tx)
		txOp = &settle.Op{ID: op.ID, Token: op.Token, InTx: true}
		ctx = settle.With(ctx, txOp)
		cw = newCapture(w, m.o.maxResponseBody)
		// A panic propagates through Do, which rolls the transaction back
		// (the key was never durably taken) and re-panics.
		g.next.ServeHTTP(cw, r.WithContext(ctx))
		cw.finish()
		if cw.err != nil || txOp.Released() {
			return durable.Result{}, errRelease
		}
		res := cw.result(m.o.stored, m.o.maxStoredBody)
		switch txStatus(cw.status) {
		case storeCompleted:
			return res, nil
		case storeFailed:
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

// serveWorkflow claims, runs the handler under a lease that is renewed until
// the handler returns, then completes, fails or marks the record uncertain.
//
// Once the handler has started, its effect may have happened: from then on
// the middleware only records an outcome (completed, failed or uncertain),
// and releases the key only when the application said that nothing happened
// ([ReleaseKey]). When no outcome can be written at all, the record stays
// processing under its lease; see settle.
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
	opID := out.OperationID
	cw := newCapture(w, m.o.maxResponseBody)
	// The engine runs the handler on a context detached from r's
	// cancellation (its values are kept), renewing the lease until it
	// returns, and records its outcome; a panic is recorded as uncertain
	// and goes on.
	rep := m.settle.Run(r.Context(), out.Lease, settle.NewOp(out.Lease), func(work context.Context) settle.Settlement {
		g.next.ServeHTTP(cw, r.WithContext(work))
		cw.finish()
		return m.settlementFor(cw)
	})
	s := rep.Settlement
	switch rep.Verdict() {
	case settle.Lost:
		// Another worker holds the operation: its outcome is the
		// operation's; ours must not be published.
		m.o.Logger.Warn("claimhttp: lease lost or "+s.Kind.String()+" fenced; response discarded", logkeys.Op, opID)
		m.inProgress(w, opID, m.o.RetryAfter)
	case settle.RecordedUncertain:
		m.uncertain(w, opID)
	case settle.RecordedRelease:
		if cw.err != nil {
			m.o.Logger.Error("claimhttp: handler wrote more than MaxResponseBody; key released as it said", logkeys.Op, opID)
			writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The response could not be produced.", "", 0)
			return
		}
		cw.publish(w)
	case settle.Recorded:
		if cw.err != nil {
			// The whole body was never buffered: the first client gets
			// what every retry will get, the status and stored headers
			// without it.
			m.o.Logger.Error("claimhttp: handler wrote more than MaxResponseBody; result stored without its body", logkeys.Op, opID)
			writeStored(w, &s.Result, false)
			return
		}
		cw.publish(w)
	case settle.ReleasePending:
		// The application said nothing happened: the lease will expire
		// and the next request runs, so "not processed" is the truth.
		m.unavailable(w)
	case settle.Pending:
		m.pending(w, opID)
	case settle.RanOut, settle.Unrecorded:
		m.o.Logger.Error("claimhttp: "+s.Kind.String()+" failed; response discarded", logkeys.Op, opID, logkeys.Err, rep.Cause())
		writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The request was processed but its result could not be recorded.", opID, 0)
	}
}

// outcome answers a claim that did not run the handler.
func (m *middleware[TTx]) outcome(w http.ResponseWriter, out claim.Outcome) {
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
	if m.c.Driver().Polls() {
		w.Header().Set("Location", m.o.operationPath+opID)
		writeProblem(w, http.StatusAccepted, claimclient.ProblemInProgress, "A request with this key is still being processed; poll the Location or retry the request.", opID, retry)
		return
	}
	writeProblem(w, http.StatusConflict, claimclient.ProblemInProgress, "A request with this key is still being processed; retry after the Retry-After delay.", opID, retry)
}

func (m *middleware[TTx]) uncertain(w http.ResponseWriter, opID string) {
	w.Header().Set("Location", m.o.operationPath+opID)
	writeProblem(w, http.StatusAccepted, claimclient.ProblemUncertain, "The outcome of the request with this key is not known yet and is being reconciled; it will not run again.", opID, m.o.RetryAfter)
}

// pending answers a request whose handler ran but whose outcome could not
// be recorded within FinishTimeout: it is not "not processed" (a retry must
// not run it again), and the record stays processing while the middleware
// keeps trying. A retry sees it in progress, then its result.
func (m *middleware[TTx]) pending(w http.ResponseWriter, opID string) {
	w.Header().Set("Location", m.o.operationPath+opID)
	writeProblem(w, http.StatusAccepted, claimclient.ProblemInProgress, "The request was processed, but its result is not recorded yet; retry with the same key or poll the Location.", opID, m.o.RetryAfter)
}

func (m *middleware[TTx]) unavailable(w http.ResponseWriter) {
	writeProblem(w, http.StatusServiceUnavailable, claimclient.ProblemUnavailable, problem.DetailUnavailable, "", m.o.RetryAfter)
}

func (m *middleware[TTx]) tooLarge(w http.ResponseWriter, opID string) {
	m.o.Logger.Error("claimhttp: handler wrote more than MaxResponseBody; transaction rolled back", logkeys.Op, opID)
	writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The response could not be produced.", "", 0)
}

// claimError answers an error from Claim or Do. The handler's result was
// not published; for ErrUnavailable it did not run.
func (m *middleware[TTx]) claimError(w http.ResponseWriter, opID string, err error) {
	switch {
	case errors.Is(err, claim.ErrMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, claimclient.ProblemKeyReused, problem.DetailKeyReused, "", 0)
	case errors.Is(err, claim.ErrUnavailable), errors.Is(err, claim.ErrLeaseExpired):
		m.unavailable(w)
	default:
		m.o.Logger.Error("claimhttp: claim failed", logkeys.Op, opID, logkeys.Err, err)
		writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The request could not be processed.", "", 0)
	}
}
