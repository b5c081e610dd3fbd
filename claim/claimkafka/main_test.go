package claimkafka_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: a
// Poll loop, a lease renewal, a settlement, a client or an in-process
// broker the code under test started and did not stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
