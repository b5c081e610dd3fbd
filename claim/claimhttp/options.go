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
)

// Headers the middleware adds to responses.
const (
	// HeaderReplayed marks a replayed response: "true".
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted marks a stored result whose body was larger than
	// Options.MaxStoredBody and was not stored: "true". Its replays carry
	// the status and stored headers with an empty body.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
	// HeaderRetention advertises, on every response of a guarded request,
	// the retention window of its operation in whole seconds (rounded
	// down): how long after the first accepted request a retry with the
	// same key is still answered from the record. After it the key starts
	// a new operation.
	HeaderRetention = "Idempotency-Retention"
)

// Defaults of [Options].
const (
	DefaultMaxStoredBody   int64 = 1 << 20
	DefaultMaxResponseBody int64 = 16 << 20
	DefaultRetryAfter            = time.Second
	DefaultOperationPath         = "/operations/"
	DefaultFinishTimeout         = 10 * time.Second
)

// DefaultStoredHeaders are the response headers stored with a result and
// replayed, when Options.StoredHeaders is nil: the ones that describe the
// representation and the created resource. Set-Cookie, Date, Vary and the
// hop-by-hop headers are deliberately absent.
var DefaultStoredHeaders = []string{
	"Cache-Control", "Content-Language", "Content-Location", "Content-Type",
	"ETag", "Last-Modified", "Link", "Location",
}

// Disposition is what the middleware does with a handler's response once
// the handler returned.
type Disposition int

const (
	// StoreCompleted stores the response as the operation's result (state
	// completed) and replays it to every retry.
	StoreCompleted Disposition = iota + 1
	// StoreFailed stores the response as a final business rejection (state
	// failed) and replays it to every retry.
	StoreFailed
	// Release stores nothing and frees the key: the next request with the
	// key runs again. In transaction mode the handler's writes roll back.
	Release
)

func (d Disposition) valid() bool { return d >= StoreCompleted && d <= Release }

// DefaultStatusFunc is the default Options.StatusFunc in transaction mode
// (Options.InTransaction), where a released response rolls the handler's
// writes back with the claim, so releasing is always safe:
//
//   - 1xx, 2xx and 3xx: StoreCompleted;
//   - 408, 409, 425 and 429: Release. They say "not now" (timeout, a
//     conflict with the resource's current state, too early, rate
//     limited), not "never": storing them would replay a transient refusal
//     for the whole retention window;
//   - every other 4xx: StoreFailed, a final answer to this request (a
//     declined payment, a resource that does not exist), replayed rather
//     than re-evaluated;
//   - 5xx: Release: the transaction rolled back, so the retry runs again.
//
// It is not the default in workflow mode, where the handler's effects do not
// roll back: there every status is stored (below 400 as completed, the rest
// as failed, replayed to every retry), and a key is released only when the
// handler calls [ReleaseKey] or a StatusFunc the application wrote says
// [Release]. A workflow handler that passes DefaultStatusFunc explicitly
// takes on the promise that its 408, 409, 425, 429 and 5xx answers come
// before any effect.
func DefaultStatusFunc(status int) Disposition {
	switch {
	case status < 400:
		return StoreCompleted
	case status == http.StatusRequestTimeout, status == http.StatusConflict,
		status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return Release
	case status < 500:
		return StoreFailed
	}
	return Release
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

	// Header is the field carrying the key. Defaults to [DefaultHeader].
	Header string

	// Methods are the guarded methods; others pass through untouched.
	// Defaults to POST and PATCH.
	Methods []string

	// Optional lets requests without a key pass through unguarded (no
	// claim, no retention header). Defaults to false: a missing key
	// answers 400 (ProblemKeyMissing). A present but invalid key is
	// always 400.
	Optional bool
	// OptionalFunc, when set, decides per request whether a missing key is
	// allowed, overriding Optional. Wrapping routes with two middlewares
	// works as well.
	OptionalFunc func(r *http.Request) bool

	// Canon configures the request fingerprint: included headers, excluded
	// JSON members, the body limit (default 1 MiB). Leave Canon.Operation
	// empty: the operation name is set per request. An invalid body answers
	// 400 (ProblemBodyInvalid), one over the limit 413
	// (ProblemBodyTooLarge), both before anything is claimed.
	Canon canon.Options

	// StoredHeaders lists the response headers stored with a result and
	// replayed. Defaults to [DefaultStoredHeaders]. The first response
	// carries every header the handler set; replays carry only these.
	StoredHeaders []string

	// MaxStoredBody is the largest response body stored with a result.
	// Defaults to [DefaultMaxStoredBody] (1 MiB). A larger body reaches the
	// first client in full, but the result is stored without it: status,
	// stored headers (less Content-Type) and resource id (the Location
	// header), plus "Idempotent-Body-Omitted: true". Replays then say so;
	// a truncated body is never replayed as if complete.
	MaxStoredBody int64

	// MaxResponseBody bounds how much of a response is buffered: the
	// response is published only once its result is durable. A handler
	// that writes more gets [ErrResponseTooLarge] from Write. In
	// transaction mode the transaction rolls back, the key is free and the
	// client gets 500 (ProblemInternal). In workflow mode, where the work
	// may have had its effect, the result is stored by its status without a
	// body (as for MaxStoredBody, with "Idempotent-Body-Omitted: true"), and
	// the first client gets exactly what its retries will. Defaults to
	// [DefaultMaxResponseBody] (16 MiB); at least MaxStoredBody.
	MaxResponseBody int64

	// StatusFunc decides by status code what becomes of a response.
	// Defaults to [DefaultStatusFunc] in transaction mode; in workflow mode
	// to storing every response (below 400 completed, the rest failed):
	// after a workflow handler started, the middleware never releases the
	// key unless the application says nothing happened ([ReleaseKey], or a
	// StatusFunc of its own that returns [Release]).
	StatusFunc func(status int) Disposition

	// InTransaction runs the handler inside [claim.Claimer.Do]: the claim,
	// the handler's writes through [Tx] and the stored result commit in one
	// transaction. The handler must not make long external calls: the
	// transaction holds a row lock that duplicates wait on. Without it the
	// middleware runs in workflow mode: it claims (the claim commits on its
	// own), runs the handler under a lease renewed by [claim.Lease.KeepAlive],
	// and completes, fails or releases the lease, fenced.
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
	// [DefaultOperationPath].
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
	http.CanonicalHeaderKey(HeaderReplayed): true, http.CanonicalHeaderKey(HeaderBodyOmitted): true,
	http.CanonicalHeaderKey(HeaderRetention): true,
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
		r.Header = DefaultHeader
	}
	if !isToken(r.Header) {
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
		if !isToken(m) {
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
		list = DefaultStoredHeaders
	}
	for _, h := range list {
		if !isToken(h) {
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
		r.MaxStoredBody = DefaultMaxStoredBody
	}
	switch {
	case r.MaxResponseBody < 0:
		return r, configErr("MaxResponseBody must not be negative")
	case r.MaxResponseBody == 0:
		r.MaxResponseBody = max(DefaultMaxResponseBody, r.MaxStoredBody)
	}
	if r.MaxResponseBody < r.MaxStoredBody {
		return r, configErr("MaxResponseBody (%d) must be at least MaxStoredBody (%d)", r.MaxResponseBody, r.MaxStoredBody)
	}
	if r.StatusFunc == nil {
		r.StatusFunc = DefaultStatusFunc
		if !r.InTransaction {
			r.StatusFunc = workflowStatusFunc
		}
	}
	switch {
	case r.RetryAfter < 0:
		return r, configErr("RetryAfter must not be negative")
	case r.RetryAfter == 0:
		r.RetryAfter = DefaultRetryAfter
	}
	if r.OperationPath == "" {
		r.OperationPath = DefaultOperationPath
	}
	switch {
	case r.FinishTimeout < 0:
		return r, configErr("FinishTimeout must not be negative")
	case r.FinishTimeout == 0:
		r.FinishTimeout = DefaultFinishTimeout
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

// isToken reports whether s is an RFC 9110 token (a field name or method).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
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

// workflowStatusFunc is the default Options.StatusFunc in workflow mode: it
// never releases, because the handler may have acted (see
// [DefaultStatusFunc]).
func workflowStatusFunc(status int) Disposition {
	if status < 400 {
		return StoreCompleted
	}
	return StoreFailed
}

var errRelease = errors.New("claimhttp: released by status policy")
