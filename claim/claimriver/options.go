package claimriver

import (
	"fmt"
	"net/http"
	"time"
)

// Option configures a [Runner]. A bad value makes [New] fail with an error
// matching [ErrConfig].
type Option func(*config) error

type config struct {
	maxAttempts   int
	queue         string
	finishTimeout time.Duration
	opPath        string
	retryAfter    time.Duration
	maxBody       int64
	validate      func(*http.Request, []byte) error
}

// WithMaxAttempts sets how many attempts River makes of each job (at least
// 1; River's default, 25, when not set). Attempts are spent by runs whose
// work said nothing happened, whose outcome could not be recorded before
// the lease ran out, or whose worker died; a work error ends the job at
// once (the operation is uncertain). A job discarded after its last
// attempt leaves the operation to the Reconciler.
func WithMaxAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: WithMaxAttempts: at least 1, got %d", ErrConfig, n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithQueue sets the River queue of the jobs (River's default queue when
// not set). The client that works them must have that queue configured.
func WithQueue(name string) Option {
	return func(c *config) error {
		if name == "" {
			return fmt.Errorf("%w: WithQueue: empty name", ErrConfig)
		}
		c.queue = name
		return nil
	}
}

// WithFinishTimeout bounds each try of the fenced write that stores an
// attempt's outcome (Complete, Fail, MarkUncertain); a try that finds the
// store unreachable is repeated until the write lands or the lease runs
// out. Defaults to 10 seconds.
func WithFinishTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithFinishTimeout: must be positive, got %v", ErrConfig, d)
		}
		c.finishTimeout = d
		return nil
	}
}

// WithOperationPath sets the prefix of the Location the HTTP handler
// answers with: prefix + operation id. Serve it with claimhttp.Operations
// (given the same prefix). Defaults to "/operations/".
func WithOperationPath(prefix string) Option {
	return func(c *config) error {
		if prefix == "" {
			return fmt.Errorf("%w: WithOperationPath: empty prefix", ErrConfig)
		}
		c.opPath = prefix
		return nil
	}
}

// WithRetryAfter sets the Retry-After of the handler's 202 answers.
// Defaults to 1 second.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithRetryAfter: must be positive, got %v", ErrConfig, d)
		}
		c.retryAfter = d
		return nil
	}
}

// WithMaxBody bounds the request body the handler accepts and stores as
// the job's payload, in bytes. Defaults to 1 MiB.
func WithMaxBody(n int64) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: WithMaxBody: at least 1, got %d", ErrConfig, n)
		}
		c.maxBody = n
		return nil
	}
}

// WithValidate makes the handler check each request before anything is
// claimed: once the key, the tenant and the body (body, at most
// [WithMaxBody] bytes; the request's Body reads the same bytes again) are
// read, and before [Runner.Enqueue]. A request it refuses reserves nothing:
// no record, no job; the same key with a corrected request then runs.
// Check here everything the work would otherwise refuse for good (a
// malformed body, a missing field): a refusal of the work is stored and
// replayed to every retry with the key.
//
// A nil error lets the request through. An error made by [claim.Reject]
// is answered with its result (status, headers, body) as it is, stored
// nowhere; use it for your own 4xx. Any other error is answered 400
// problem (claimclient.ProblemBodyInvalid, "Request body invalid") whose
// "detail" is the error's message: it goes to the client, so it must not
// quote secrets. Every refusal carries "Cache-Control: no-store" and
// Idempotency-Retention, like the handler's other answers.
func WithValidate(fn func(r *http.Request, body []byte) error) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("%w: WithValidate: nil function", ErrConfig)
		}
		c.validate = fn
		return nil
	}
}

func newConfig(opts []Option) (config, error) {
	c := config{finishTimeout: 10 * time.Second, opPath: "/operations/", retryAfter: time.Second, maxBody: 1 << 20}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: nil Option", ErrConfig)
		}
		if err := o(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}
