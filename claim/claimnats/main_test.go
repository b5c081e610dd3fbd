package claimnats_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: a
// Consumer's in-progress signals or delayed requeue, a lease renewal, a
// settlement, a consume loop or a pool the code under test started and
// did not stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
