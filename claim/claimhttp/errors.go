package claimhttp

import "errors"

var (
	// ErrConfig is returned by [Middleware] for an invalid option; the
	// message names it.
	ErrConfig = errors.New("claimhttp: invalid configuration")

	// ErrResponseTooLarge is returned by the response writer of a guarded
	// handler once the handler writes more than [WithMaxResponseBody]
	// bytes: the middleware must buffer a response until its result is
	// durable, and refuses to buffer without bound. What the client and
	// the retries then get: package documentation, "Replays and their
	// limits".
	ErrResponseTooLarge = errors.New("claimhttp: response larger than MaxResponseBody")

	// ErrNotGuarded is returned by [MarkUncertain] when the context is not
	// that of a handler running under a workflow-mode claim of [Middleware],
	// and by [ReleaseKey] outside any guarded handler.
	ErrNotGuarded = errors.New("claimhttp: not inside a guarded handler")
)
