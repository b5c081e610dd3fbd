package sqlite_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: a
// KeepAlive, Reconciler, sweeper, breaker probe or pool the code under test
// started and did not stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
