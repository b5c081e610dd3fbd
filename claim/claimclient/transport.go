package claimclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/oncekey/oncekey/durable/driver/wire"
	"github.com/oncekey/oncekey/internal/httptoken"
)

// Defaults of a [Transport], as its options document them.
const (
	defaultMaxAttempts   = 4
	defaultBaseDelay     = 100 * time.Millisecond
	defaultMaxDelay      = 5 * time.Second
	defaultMaxRetryAfter = 30 * time.Second
)

// Option configures a [Transport]. An option given a bad value makes
// [NewTransport] fail with an error that matches [ErrConfig] and names the
// option.
type Option func(*config) error

// config is a Transport's configuration after its options.
type config struct {
	header        string
	maxAttempts   int
	baseDelay     time.Duration
	maxDelay      time.Duration // 0: max(defaultMaxDelay, baseDelay)
	maxRetryAfter time.Duration
	budget        *RetryBudget
}

// WithHeader sets the field carrying the key. Defaults to "Idempotency-Key".
func WithHeader(name string) Option {
	return func(c *config) error {
		if !httptoken.Valid(name) {
			return configErr("WithHeader: %q is not a field name", name)
		}
		c.header = name
		return nil
	}
}

// WithMaxAttempts bounds the attempts per request, the first included.
// Defaults to 4; 1 turns retries off.
func WithMaxAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return configErr("WithMaxAttempts: must be at least 1, got %d", n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithBaseDelay and [WithMaxDelay] shape the backoff: before retry n
// (1, 2, ...) the transport sleeps a uniformly random duration in
// [0, min(max delay, base delay×2^(n-1))) ("full jitter"). Default 100ms
// and 5s (at least the base delay; [NewTransport] fails when a max delay
// set is shorter). Both must be positive.
func WithBaseDelay(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return configErr("WithBaseDelay: must be positive, got %v", d)
		}
		c.baseDelay = d
		return nil
	}
}

// WithMaxDelay caps the backoff; see [WithBaseDelay].
func WithMaxDelay(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return configErr("WithMaxDelay: must be positive, got %v", d)
		}
		c.maxDelay = d
		return nil
	}
}

// WithMaxRetryAfter sets the longest Retry-After the transport waits out;
// a response asking for longer is returned to the caller. Defaults to 30s;
// must be positive.
func WithMaxRetryAfter(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return configErr("WithMaxRetryAfter: must be positive, got %v", d)
		}
		c.maxRetryAfter = d
		return nil
	}
}

// WithBudget pays the transport's retries from b, which limits retries
// across requests. Defaults to a budget of its own with the
// [NewRetryBudget] defaults (10% of requests plus 10 per 10s window).
// Share one budget between transports to bound them together.
func WithBudget(b *RetryBudget) Option {
	return func(c *config) error {
		if b == nil {
			return configErr("WithBudget: nil budget")
		}
		c.budget = b
		return nil
	}
}

// hooks are the clock, the sleep (which must return early with an error
// when ctx is done), the randomness (a uniform duration in [0, n)) and the
// key source of a Transport; tests replace them.
type hooks struct {
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(n time.Duration) time.Duration
	newKey func() (string, error)
}

func defaultHooks() hooks {
	return hooks{
		now:   time.Now,
		sleep: sleep,
		jitter: func(n time.Duration) time.Duration {
			if n <= 0 {
				return 0
			}
			return rand.N(n)
		},
		newKey: NewKey,
	}
}

// Transport is an http.RoundTripper that makes unsafe requests safe to
// retry and retries them:
//
//   - It adds a fresh key, in the draft's quoted form
//     (`Idempotency-Key: "3f0c..."`), to every request whose method is not
//     safe (anything but GET, HEAD, OPTIONS, TRACE) and that has none, and
//     sends the same key on every retry of the request. A key the caller
//     set is kept as it is.
//   - It retries connection errors (the server may have committed and lost
//     the response: the retry gets the stored result), 5xx but 501 and 505,
//     429, and 409 whose body is a problem of type [ProblemInProgress]
//     (never any other 409, nor 400, 422 or another 4xx). It never retries
//     a replay ("Idempotent-Replayed: true"), whatever its status: a stored
//     result is final for its key, and another attempt would get it again.
//   - Between attempts it sleeps a capped exponential backoff with full
//     jitter, and at least the response's Retry-After (seconds or an
//     HTTP-date). It never sleeps past the request context's deadline: when
//     the next attempt could not start in time, it returns what it has.
//   - It rewinds the body with Request.GetBody; a request with a body and
//     no GetBody is sent once.
//   - Every retry is paid from a [RetryBudget]; when it is spent the last
//     response (or error) is returned as it is.
//
// When it gives up it returns the last response, or the last error, as the
// base transport produced it. It is safe for concurrent use.
type Transport struct {
	base   http.RoundTripper
	o      config
	h      hooks
	header string
}

// NewTransport returns a Transport over base (http.DefaultTransport when
// nil), configured by opts. Errors: [ErrConfig] naming the bad option.
func NewTransport(base http.RoundTripper, opts ...Option) (*Transport, error) {
	return newTransport(base, opts, defaultHooks())
}

func newTransport(base http.RoundTripper, opts []Option, h hooks) (*Transport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	o := config{header: wire.Header, maxAttempts: defaultMaxAttempts, baseDelay: defaultBaseDelay, maxRetryAfter: defaultMaxRetryAfter}
	for _, opt := range opts {
		if opt == nil {
			return nil, configErr("nil Option")
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	switch {
	case o.maxDelay == 0:
		o.maxDelay = max(defaultMaxDelay, o.baseDelay)
	case o.maxDelay < o.baseDelay:
		return nil, configErr("WithMaxDelay (%v) must be at least the base delay (%v)", o.maxDelay, o.baseDelay)
	}
	if o.budget == nil {
		b, err := newRetryBudget(nil, h.now)
		if err != nil {
			return nil, err
		}
		o.budget = b
	}
	return &Transport{base: base, o: o, h: h, header: http.CanonicalHeaderKey(o.header)}, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

func safeMethod(m string) bool {
	switch m {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// RoundTrip sends req, retrying as the type's documentation says.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	out := req
	if !safeMethod(req.Method) && len(req.Header.Values(t.header)) == 0 {
		key, err := t.h.newKey()
		var v string
		if err == nil {
			v, err = wire.FormatKey(key)
		}
		if err != nil {
			closeBody(req)
			return nil, fmt.Errorf("claimclient: new key: %w", err)
		}
		out = req.Clone(ctx) // shares the body; the caller's request is left alone
		out.Header.Set(t.header, v)
	}
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	t.o.budget.request()
	for attempt := 1; ; attempt++ {
		resp, err := t.base.RoundTrip(out)
		retry, after := t.retryable(ctx, resp, err)
		if !retry || !rewindable || attempt >= t.o.maxAttempts || after > t.o.maxRetryAfter {
			return resp, err
		}
		ceiling := t.o.baseDelay << min(attempt-1, 30)
		if ceiling <= 0 || ceiling > t.o.maxDelay {
			ceiling = t.o.maxDelay
		}
		delay := after + t.h.jitter(ceiling)
		if dl, ok := ctx.Deadline(); ok && !t.h.now().Add(delay).Before(dl) {
			return resp, err // the next attempt could not start in time
		}
		next, rerr := rewind(out)
		if rerr != nil {
			return resp, err
		}
		if !t.o.budget.tryRetry() {
			closeBody(next)
			return resp, err
		}
		discard(resp)
		if serr := t.h.sleep(ctx, delay); serr != nil {
			closeBody(next)
			return nil, serr
		}
		out = next
	}
}

// retryable classifies one attempt and returns the Retry-After it asked
// for (zero when none).
func (t *Transport) retryable(ctx context.Context, resp *http.Response, err error) (bool, time.Duration) {
	if err != nil {
		if ctx.Err() != nil {
			return false, 0
		}
		var cve *tls.CertificateVerificationError
		var uae x509.UnknownAuthorityError
		var hne x509.HostnameError
		var cie x509.CertificateInvalidError
		if errors.As(err, &cve) || errors.As(err, &uae) || errors.As(err, &hne) || errors.As(err, &cie) {
			return false, 0 // retrying cannot fix a certificate
		}
		return true, 0
	}
	if replayed(resp) {
		// The stored answer for the key: final, whatever its status.
		// Another attempt gets the same bytes and only spends budget.
		return false, 0
	}
	switch s := resp.StatusCode; {
	case s == http.StatusTooManyRequests,
		s >= 500 && s != http.StatusNotImplemented && s != http.StatusHTTPVersionNotSupported,
		s == http.StatusConflict && inProgress(resp):
		return true, t.retryAfter(resp)
	}
	return false, 0
}

// retryAfter parses Retry-After: delay-seconds or an HTTP-date.
func (t *Transport) retryAfter(resp *http.Response) time.Duration {
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > int64(time.Duration(1<<62)/time.Second) {
			return time.Duration(1 << 62)
		}
		return time.Duration(n) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(t.h.now()), 0)
	}
	return 0
}

// replayed reports whether resp is a replay of a stored result
// ("Idempotent-Replayed: true").
func replayed(resp *http.Response) bool {
	return strings.EqualFold(strings.TrimSpace(resp.Header.Get(HeaderReplayed)), "true")
}

// maxProblem bounds how much of a 409 body is read to find its type.
const maxProblem = 64 << 10

// inProgress reports whether a 409 response is the middleware's "request
// in progress" problem. It reads at most maxProblem bytes of the body and
// leaves the body readable from the start.
func inProgress(resp *http.Response) bool {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != wire.ProblemContentType || resp.Body == nil {
		return false
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxProblem))
	resp.Body = &rebody{Reader: io.MultiReader(bytes.NewReader(head), resp.Body), Closer: resp.Body}
	if err != nil {
		return false
	}
	var p struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(head, &p) == nil && p.Type == ProblemInProgress
}

type rebody struct {
	io.Reader
	io.Closer
}

// rewind returns a copy of req with a fresh body for the next attempt.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return next, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	next.Body = body
	return next, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// discard drains a little of a response body, so the connection can be
// reused, and closes it.
func discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	_ = resp.Body.Close()
}
