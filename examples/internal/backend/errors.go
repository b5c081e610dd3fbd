package backend

import "errors"

var (
	// ErrUnreachable is returned by [Open] when a named server does not
	// answer. The message names the server by host, never by its URL (which
	// may hold a password).
	ErrUnreachable = errors.New("backend: server unreachable")

	// ErrConfig is returned by [Open] for a URL that cannot be parsed.
	ErrConfig = errors.New("backend: invalid configuration")
)
