// Package adapter gives the project's adapters of package claim (claimhttp)
// the settings of a Claimer they act on, which are not part of claim's API:
// a user configured them and knows them. Package claim sets the functions
// when it is initialized, before any adapter can hold a Claimer.
package adapter

import (
	"time"

	"github.com/oncekey/oncekey/durable"
)

var (
	// Retention returns the retention of an operation under claimer (a
	// *claim.Claimer of any transaction type).
	Retention func(claimer any, operation string) time.Duration
	// Polls reports whether claimer was configured with claim.WithPoll.
	Polls func(claimer any) bool
	// Rejected returns the result of an error made by claim.Reject, for
	// adapters that settle a Lease (workflow mode) from a handler's error.
	Rejected func(err error) (durable.Result, bool)
)
