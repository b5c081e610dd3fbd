package claimriver

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs the worker process of the kill test when started as it
// (childEnv, see kill_test.go); otherwise it fails the package's tests when
// a goroutine outlives them: a River client, a lease renewal, a settlement
// or a pool the code under test started and did not stop.
func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		runChild(v)
		return
	}
	goleak.VerifyTestMain(m)
}
