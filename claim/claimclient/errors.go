package claimclient

import (
	"errors"
	"fmt"
)

// ErrConfig is returned by [NewTransport] and [NewRetryBudget] for an
// invalid option; the message names it.
var ErrConfig = errors.New("claimclient: invalid configuration")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}
