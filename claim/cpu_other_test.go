//go:build !unix

package claim_test

import (
	"testing"
	"time"
)

// processCPU is 0 where getrusage is not available.
func processCPU(*testing.B) time.Duration { return 0 }
