package claimhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/internal/wire"
)

// Defaults of [Options].
const (
	defaultMaxStoredBody   int64 = 1 << 20
	defaultMaxResponseBody int64 = 16 << 20
	defaultRetryAfter            = time.Second
	defaultOperationPath         = "/operations/"
	defaultFinishTimeout         = 10 * time.Second
)

// defaultStoredHeaders are the response headers stored with a result and
// replayed when Options.StoredHeaders is nil: the ones that describe the
// representation and the created resource. Set-Cookie, Date, Vary and the
// hop-by-hop headers are deliberately absent.
var defaultStoredHeaders = []string{
	"Cache-Control", "Content-Language", "Content-Location", "Content-Type",
	"ETag", "Last-Modified", "Link", "Location",
}

// disposition is what the middleware does with a handler's response once
// the handler returned, by its status (see the package documentation,
// "What the middleware does with a guarded request", step 5).
type disposition int

const (
	storeCompleted disposition = iota + 1 // stored as the result, replayed
	storeFailed                           // stored as a final rejection, replayed
	release                               // nothing stored, the key is free
)

// txStatus is the status policy in transaction mode (package
// documentation, step 5): a released response rolls the handler's writes
// back with the claim, so releasing is always safe, and the "not now"
// answers (408, 409, 425, 429) and 5xx release rather than replay a
// transient refusal for the whole retention window.
func txStatus(status int) disposition {
	switch {
	case status < 400:
		return storeCompleted
	case status == http.StatusRequestTimeout, status == http.StatusConflict,
		status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return release
	case status < 500:
		return storeFailed
	}
	return release
}

// workflowStatus is the status policy in workflow mode, where the handler's
// effects do not roll back: it never releases, because the handler may
// have acted. Below 400 the response is stored as completed, the rest as
// failed; a key is released only when the handler calls [ReleaseKey].
func workflowStatus(status int) disposition {
	if status < 400 {
		return storeCompleted
	}
	return storeFailed
}

// Options configure [Middleware]. Only TenantFunc is required.
type Options struct {
	// TenantFunc returns the authenticated caller of r, typically read from
	// the principal an authentication middleware put in r's context. It is
	// required: there is no default, and none that trusts a client header.
	// An error or an empty tenant answers 401 (ProblemUnidentified) before
	// anything is claimed.
	TenantFunc func(r *http.Request) (string, error)

	// OperationFunc names the operation of r: a key only ever collides
	// with itself within one tenant and operation, and retention is set per
	// operation. Name the route, never the path: "POST /orders/{id}/refunds",
	// not "/orders/42/refunds". Defaults to the method and the route
	// pattern net/http's ServeMux matched (r.Pattern, without its own method
	// prefix); for that, wrap each route (mux.Handle("POST /orders",
	// guard(h))), not the whole mux. With another router, set it from the
	// router's own pattern, for chi:
	//
	//	OperationFunc: func(r *http.Request) string {
	//		return r.Method + " " + chi.RouteContext(r.Context()).RoutePattern()
	//	},
	//
	// with the middleware on the route (r.With(guard).Post(...)), so the
	// pattern is complete when it runs. An empty name (by default: no
	// r.Pattern) answers 500 and logs why.
	OperationFunc func(r *http.Request) string

	// Header is the field carrying the key. Defaults to "Idempotency-Key".
	Header string

	// Methods are the guarded methods; others pass through untouched.
	// Defaults to POST and PATCH.
	Methods []string

	// Optional, when set, decides per request whether a request without a
	// key passes through unguarded (no claim, no retention header). When
	// nil, or when it returns false, a missing key answers 400
	// (ProblemKeyMissing); a present but invalid key is always 400. For
	// every request: func(*http.Request) bool { return true }.
	Optional func(r *http.Request) bool

	// Canon configures the request fingerprint: included headers, excluded
	// JSON members, the body limit (default 1 MiB). Leave Canon.Operation
	// empty: the operation name is set per request. An invalid body answers
	// 400 (ProblemBodyInvalid), one over the limit 413
	// (ProblemBodyTooLarge), both before anything is claimed.
	Canon canon.Options

	// StoredHeaders, MaxStoredBody and MaxResponseBody decide what is
	// stored and replayed, and how much of a response is buffered; what a
	// replay then carries is described once, in the package documentation
	// ("Replays and their limits").
	//
	// StoredHeaders lists the response headers stored with a result and
	// replayed. Defaults to Cache-Control, Content-Language,
	// Content-Location, Content-Type, ETag, Last-Modified, Link and
	// Location; hop-by-hop headers, Content-Length, Date, Retry-After and
	// the middleware's own cannot be stored.
	StoredHeaders []string
	// MaxStoredBody is the largest response body stored with a result.
	// Defaults to 1 MiB.
	MaxStoredBody int64
	// MaxResponseBody bounds how much of a response is buffered (it is
	// published only once its result is durable); a handler that writes
	// more gets [ErrResponseTooLarge] from Write. Defaults to 16 MiB; at
	// least MaxStoredBody.
	MaxResponseBody int64

	// InTransaction runs the handler inside [claim.Claimer.Do]: the claim,
	// the handler's writes through [Tx] and the stored result commit in one
	// transaction. The handler must not make long external calls: the
	// transaction holds a row lock that duplicates wait on. Without it the
	// middleware runs in workflow mode: it claims (the claim commits on its
	// own), runs the handler under a lease renewed by [claim.Lease.KeepAlive],
	// and completes, fails or marks the record uncertain, fenced. The
	// response's status decides whether it is stored or the key released,
	// by a fixed policy per mode (package documentation, step 5).
	InTransaction bool

	// RetryAfter is the Retry-After sent with in-progress answers (capped
	// at the holder's remaining lease) and 503s. Defaults to 1s; sent in
	// whole seconds, at least 1.
	RetryAfter time.Duration

	// OperationPath prefixes the operation identity to form the Location
	// of 202 answers (in progress under the [claim.WithPoll] setting, and
	// uncertain): Location is OperationPath + id, "/operations/op_...".
	// The service serves that resource if it wants one (for example from
	// its own table keyed by [OperationID]); re-sending the original
	// request with the same key is always a valid way to poll. Defaults to
	// "/operations/".
	OperationPath string

	// FinishTimeout bounds how long the client waits for the durable step
	// after a workflow handler returned (complete, fail, mark uncertain,
	// release), retried while the store is unreachable. The step runs
	// detached from the client's cancellation, so a client that went away
	// still leaves a stored result for its retry. If it is still not
	// written then, the client gets 202 (ProblemInProgress, Location) and
	// the middleware keeps the lease renewed and goes on trying in the
	// background until the lease runs out; retries see the operation in
	// progress meanwhile. Defaults to 10s.
	FinishTimeout time.Duration

	// Logger logs failures of those steps, by operation identity only.
	// Defaults to discarding.
	Logger *slog.Logger
}

// resolved is Options after defaults and validation.
type resolved struct {
	Options
	methods map[string]bool
	stored  []string
}

// reserved are response headers that cannot be stored: hop-by-hop,
// computed per response, or the middleware's own.
var reserved = map[string]bool{
	"Connection": true, "Content-Length": true, "Date": true, "Keep-Alive": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Retry-After": true,
	http.CanonicalHeaderKey(claimclient.HeaderReplayed): true, http.CanonicalHeaderKey(claimclient.HeaderBodyOmitted): true,
	http.CanonicalHeaderKey(claimclient.HeaderRetention): true,
}

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

func resolve(o Options) (resolved, error) {
	r := resolved{Options: o, methods: map[string]bool{}}
	if o.TenantFunc == nil {
		return r, configErr("TenantFunc is required (the tenant must come from authentication)")
	}
	if r.Header == "" {
		r.Header = wire.Header
	}
	if !wire.IsToken(r.Header) {
		return r, configErr("Header %q is not a field name", r.Header)
	}
	r.Header = http.CanonicalHeaderKey(r.Header)
	if r.Methods == nil {
		r.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if len(r.Methods) == 0 {
		return r, configErr("Methods is empty")
	}
	for _, m := range r.Methods {
		if !wire.IsToken(m) {
			return r, configErr("Methods: %q is not a method", m)
		}
		r.methods[m] = true
	}
	if r.Canon.Operation != "" {
		return r, configErr("Canon.Operation must be empty: the operation is set per request by OperationFunc")
	}
	probe := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/"}, Header: http.Header{}}
	if _, err := canon.Request(probe, r.Canon); err != nil {
		return r, configErr("Canon: %w", err)
	}
	list := r.StoredHeaders
	if list == nil {
		list = defaultStoredHeaders
	}
	for _, h := range list {
		if !wire.IsToken(h) {
			return r, configErr("StoredHeaders: %q is not a field name", h)
		}
		c := http.CanonicalHeaderKey(h)
		if reserved[c] {
			return r, configErr("StoredHeaders: %s cannot be stored", c)
		}
		r.stored = append(r.stored, c)
	}
	switch {
	case r.MaxStoredBody < 0:
		return r, configErr("MaxStoredBody must not be negative")
	case r.MaxStoredBody == 0:
		r.MaxStoredBody = defaultMaxStoredBody
	}
	switch {
	case r.MaxResponseBody < 0:
		return r, configErr("MaxResponseBody must not be negative")
	case r.MaxResponseBody == 0:
		r.MaxResponseBody = max(defaultMaxResponseBody, r.MaxStoredBody)
	}
	if r.MaxResponseBody < r.MaxStoredBody {
		return r, configErr("MaxResponseBody (%d) must be at least MaxStoredBody (%d)", r.MaxResponseBody, r.MaxStoredBody)
	}
	switch {
	case r.RetryAfter < 0:
		return r, configErr("RetryAfter must not be negative")
	case r.RetryAfter == 0:
		r.RetryAfter = defaultRetryAfter
	}
	if r.OperationPath == "" {
		r.OperationPath = defaultOperationPath
	}
	switch {
	case r.FinishTimeout < 0:
		return r, configErr("FinishTimeout must not be negative")
	case r.FinishTimeout == 0:
		r.FinishTimeout = defaultFinishTimeout
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

// defaultOperation is the default OperationFunc: the method and the route
// pattern the router matched. It returns "" (the middleware answers 500 and
// logs why) when the router set no r.Pattern — a router other than
// net/http's ServeMux (chi, gorilla/mux), or the middleware wrapped around a
// whole mux — rather than fall back to the raw path, which would make every
// resource id an operation of its own (and unbounded in number).
func defaultOperation(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return ""
	}
	// A Go 1.22 pattern may start with its own method: "POST /orders".
	if i := strings.IndexAny(p, " \t"); i > 0 && !strings.Contains(p[:i], "/") {
		p = strings.TrimLeft(p[i:], " \t")
	}
	return r.Method + " " + p
}

var errRelease = errors.New("claimhttp: released by status policy")
