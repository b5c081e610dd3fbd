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
	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/durable/driver/wire"
	"github.com/oncekey/oncekey/internal/httptoken"
)

// Defaults of [Middleware], as its options document them.
const (
	defaultMaxStoredBody   int64 = 1 << 20
	defaultMaxResponseBody int64 = 16 << 20
	defaultOperationPath         = "/operations/"
)

// defaultStoredHeaders are the response headers stored with a result and
// replayed without [WithStoredHeaders]: the ones that describe the
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

// Option configures [Middleware]. An option given a bad value makes
// Middleware fail with an error that matches [ErrConfig] and names the
// option.
type Option func(*config) error

// config is the middleware's configuration: the tenant function, then the
// options over the defaults.
type config struct {
	tenant          func(r *http.Request) (string, error)
	operation       func(r *http.Request) string // nil: defaultOperation
	header          string
	methods         map[string]bool
	optional        func(r *http.Request) bool
	canonOpts       canon.Options
	stored          []string // canonical names
	maxStoredBody   int64
	maxResponseBody int64 // 0: max(defaultMaxResponseBody, maxStoredBody)
	inTransaction   bool
	lease           time.Duration // WithLease; 0: the Claimer's
	operationPath   string
	settle.Settings
}

// WithOperation names the operation of r: a key only ever collides with
// itself within one tenant and operation, and retention is set per
// operation. Name the route, never the path: "POST /orders/{id}/refunds",
// not "/orders/42/refunds". Defaults to the method and the route pattern
// net/http's ServeMux matched (r.Pattern, without its own method prefix);
// for that, wrap each route (mux.Handle("POST /orders", guard(h))), not the
// whole mux. With another router, set it from the router's own pattern,
// for chi:
//
//	claimhttp.WithOperation(func(r *http.Request) string {
//		return r.Method + " " + chi.RouteContext(r.Context()).RoutePattern()
//	})
//
// with the middleware on the route (r.With(guard).Post(...)), so the
// pattern is complete when it runs. An empty name (by default: no
// r.Pattern) answers 500 and logs why.
func WithOperation(f func(r *http.Request) string) Option {
	return func(c *config) error {
		if f == nil {
			return configErr("WithOperation: nil function")
		}
		c.operation = f
		return nil
	}
}

// WithHeader sets the field carrying the key. Defaults to "Idempotency-Key".
func WithHeader(name string) Option {
	return func(c *config) error {
		if !httptoken.Valid(name) {
			return configErr("WithHeader: %q is not a field name", name)
		}
		c.header = http.CanonicalHeaderKey(name)
		return nil
	}
}

// WithMethods sets the guarded methods, at least one; others pass through
// untouched. Defaults to POST and PATCH.
func WithMethods(methods ...string) Option {
	return func(c *config) error {
		if len(methods) == 0 {
			return configErr("WithMethods: no method")
		}
		set := map[string]bool{}
		for _, m := range methods {
			if !httptoken.Valid(m) {
				return configErr("WithMethods: %q is not a method", m)
			}
			set[m] = true
		}
		c.methods = set
		return nil
	}
}

// WithOptional decides per request whether a request without a key passes
// through unguarded (no claim, no retention header). By default, or when
// f returns false, a missing key answers 400 (ProblemKeyMissing); a present
// but invalid key is always 400. For every request:
// func(*http.Request) bool { return true }.
func WithOptional(f func(r *http.Request) bool) Option {
	return func(c *config) error {
		if f == nil {
			return configErr("WithOptional: nil function")
		}
		c.optional = f
		return nil
	}
}

// WithCanon configures the request fingerprint: included headers, excluded
// JSON members, the body limit (default 1 MiB). Leave o.Operation empty:
// the operation name is set per request. An invalid body answers 400
// (ProblemBodyInvalid), one over the limit 413 (ProblemBodyTooLarge), both
// before anything is claimed.
func WithCanon(o canon.Options) Option {
	return func(c *config) error {
		if o.Operation != "" {
			return configErr("WithCanon: Operation must be empty: the operation is set per request")
		}
		probe := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/"}, Header: http.Header{}}
		if _, err := canon.Request(probe, o); err != nil {
			return configErr("WithCanon: %w", err)
		}
		c.canonOpts = o
		return nil
	}
}

// WithStoredHeaders, [WithMaxStoredBody] and [WithMaxResponseBody] decide
// what is stored and replayed, and how much of a response is buffered;
// what a replay then carries is described once, in the package
// documentation ("Replays and their limits").
//
// WithStoredHeaders lists the response headers stored with a result and
// replayed; none stores no header. Defaults to Cache-Control,
// Content-Language, Content-Location, Content-Type, ETag, Last-Modified,
// Link and Location; hop-by-hop headers, Content-Length, Date,
// Retry-After and the middleware's own cannot be stored.
func WithStoredHeaders(names ...string) Option {
	return func(c *config) error {
		stored, err := storedHeaders(names)
		if err != nil {
			return err
		}
		c.stored = stored
		return nil
	}
}

func storedHeaders(names []string) ([]string, error) {
	stored := []string{}
	for _, h := range names {
		if !httptoken.Valid(h) {
			return nil, configErr("WithStoredHeaders: %q is not a field name", h)
		}
		name := http.CanonicalHeaderKey(h)
		if reserved[name] {
			return nil, configErr("WithStoredHeaders: %s cannot be stored", name)
		}
		stored = append(stored, name)
	}
	return stored, nil
}

// WithMaxStoredBody sets the largest response body stored with a result,
// in bytes; must be positive. Defaults to 1 MiB.
func WithMaxStoredBody(n int64) Option {
	return func(c *config) error {
		if n <= 0 {
			return configErr("WithMaxStoredBody: must be positive, got %d", n)
		}
		c.maxStoredBody = n
		return nil
	}
}

// WithMaxResponseBody bounds how much of a response is buffered, in bytes
// (it is published only once its result is durable); a handler that writes
// more gets [ErrResponseTooLarge] from Write. Defaults to 16 MiB; at least
// the stored body limit ([WithMaxStoredBody]).
func WithMaxResponseBody(n int64) Option {
	return func(c *config) error {
		if n <= 0 {
			return configErr("WithMaxResponseBody: must be positive, got %d", n)
		}
		c.maxResponseBody = n
		return nil
	}
}

// WithInTransaction runs the handler inside [claim.Claimer.Do]: the
// handler's writes through [Tx] and the stored result commit in one
// transaction. The handler must not make long external calls: the
// transaction holds its locks while it runs. Do claims the key first, in
// that transaction, so the handler runs once per record life and never
// for a duplicate: a duplicate is answered in progress (409, or it waits
// with [claim.WithWait]) while the transaction is open, and replays the
// stored response once it committed. (Only a Claimer built with
// [claim.WithWriteAtCommit] writes the record with the COMMIT, and then a
// duplicate in flight that Redis did not stop runs the handler too, its
// writes rolled back.) Without it the
// middleware runs in workflow mode: it claims (the claim commits on its
// own), runs the handler under a lease renewed by [claim.Lease.KeepAlive],
// and completes, fails or marks the record uncertain, fenced. The
// response's status decides whether it is stored or the key released, by
// a fixed policy per mode (package documentation, step 5).
func WithInTransaction() Option {
	return func(c *config) error {
		c.inTransaction = true
		return nil
	}
}

// WithRetryAfter sets the Retry-After sent with in-progress answers (capped
// at the holder's remaining lease) and 503s; must be positive. Defaults to
// 1s; sent in whole seconds, at least 1.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) error { return configErrOf(c.SetRetryAfter(d)) }
}

// WithOperationPath sets the prefix of the operation identity that forms
// the Location of 202 answers (in progress under the [claim.WithPoll]
// setting, and uncertain): Location is prefix + id, "/operations/op_...".
// [Operations] serves that resource (give it the same prefix);
// re-sending the original request with the same key is always a valid way
// to poll. Defaults to "/operations/";
// must not be empty.
func WithOperationPath(prefix string) Option {
	return func(c *config) error {
		if prefix == "" {
			return configErr("WithOperationPath: empty prefix")
		}
		c.operationPath = prefix
		return nil
	}
}

// WithLease sets the lease of every claim the middleware makes, in place
// of the Claimer's ([claim.WithLease]): a route whose work is longer or
// shorter than the rest gets a middleware of its own. The lease follows
// the Claimer's one rule (see [claim.ErrInvalidLease]): zero is the
// Claimer's lease, a negative one or one under the floor is refused by
// [Middleware] (matching [ErrConfig] and claim.ErrInvalidLease), and one
// longer than an operation's retention makes that operation's claims fail
// (500, logged) until the retention or the lease is fixed.
func WithLease(d time.Duration) Option {
	return func(c *config) error {
		c.lease = d // checked by Middleware, with the Claimer's lease rule
		return nil
	}
}

// WithFinishTimeout bounds how long the client waits for the durable step
// after a workflow handler returned (complete, fail, mark uncertain,
// release), retried while the store is unreachable; must be positive. The
// step runs detached from the client's cancellation, so a client that went
// away still leaves a stored result for its retry. If it is still not
// written then, the client gets 202 (ProblemInProgress, Location) and the
// middleware keeps the lease renewed and goes on trying in the background
// until the lease runs out; retries see the operation in progress
// meanwhile. Defaults to 10s.
func WithFinishTimeout(d time.Duration) Option {
	return func(c *config) error { return configErrOf(c.SetFinishTimeout(d)) }
}

// WithLogger logs failures of those steps with l, by operation identity
// only. Defaults to discarding.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return configErrOf(c.SetLogger(l)) }
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

// newConfig applies opts over the defaults and checks what no single
// option can.
func newConfig(tenant func(r *http.Request) (string, error), opts []Option) (config, error) {
	c := config{
		tenant:        tenant,
		header:        http.CanonicalHeaderKey(wire.Header),
		methods:       map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		maxStoredBody: defaultMaxStoredBody,
		operationPath: defaultOperationPath,
		Settings:      settle.DefaultSettings(),
	}
	if tenant == nil {
		return c, configErr("nil tenant function (the tenant must come from authentication)")
	}
	stored, err := storedHeaders(defaultStoredHeaders)
	if err != nil {
		return c, err
	}
	c.stored = stored
	for _, opt := range opts {
		if opt == nil {
			return c, configErr("nil Option")
		}
		if err := opt(&c); err != nil {
			return c, err
		}
	}
	switch {
	case c.maxResponseBody == 0:
		c.maxResponseBody = max(defaultMaxResponseBody, c.maxStoredBody)
	case c.maxResponseBody < c.maxStoredBody:
		return c, configErr("WithMaxResponseBody (%d) must be at least WithMaxStoredBody (%d)", c.maxResponseBody, c.maxStoredBody)
	}
	return c, nil
}

// defaultOperation is the default operation name ([WithOperation]): the method and the route
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

// configErrOf wraps a shared setting's error in ErrConfig.
func configErrOf(err error) error {
	if err != nil {
		return configErr("%w", err)
	}
	return nil
}
