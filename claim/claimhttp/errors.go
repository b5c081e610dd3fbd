package claimhttp

import "errors"

var (
	// ErrConfig is returned by [Middleware], [NewTransport] and
	// [NewRetryBudget] for an invalid option; the message names it.
	ErrConfig = errors.New("claimhttp: invalid configuration")

	// ErrKeyMissing is returned by [ParseKey] when the request carries no
	// idempotency key field.
	ErrKeyMissing = errors.New("claimhttp: idempotency key missing")

	// ErrKeyInvalid is returned by [ParseKey] for a key that is neither an
	// RFC 8941 sf-string nor a bare key, that is sent on more than one field
	// line, or that is not 1 to 255 printable ASCII characters after
	// unquoting. The message never quotes the key. [FormatKey] returns it
	// for a key it cannot encode.
	ErrKeyInvalid = errors.New("claimhttp: idempotency key invalid")

	// ErrResponseTooLarge is returned by the response writer of a guarded
	// handler once the handler writes more than Options.MaxResponseBody
	// bytes. The key is released and the client gets a 500 problem: the
	// middleware must buffer a response until its result is durable, and
	// refuses to buffer without bound.
	ErrResponseTooLarge = errors.New("claimhttp: response larger than MaxResponseBody")

	// ErrNotGuarded is returned by [MarkUncertain] when the context is not
	// that of a handler running under a workflow-mode claim of [Middleware],
	// and by [ReleaseKey] outside any guarded handler.
	ErrNotGuarded = errors.New("claimhttp: not inside a guarded handler")
)
