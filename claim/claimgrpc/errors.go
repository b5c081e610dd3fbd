package claimgrpc

import (
	"errors"
	"fmt"
)

var (
	// ErrConfig is returned by [UnaryServerInterceptor] and
	// [UnaryClientInterceptor] for an invalid argument or option; the
	// message names it.
	ErrConfig = errors.New("claimgrpc: invalid configuration")

	// ErrNotGuarded is returned by [MarkUncertain] and [ReleaseKey] when
	// the context is not that of a handler running under the server
	// interceptor's claim.
	ErrNotGuarded = errors.New("claimgrpc: not inside a guarded handler")
)

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}
