package claimclient_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: a
// connection of a test server or transport left open, or a round trip the
// transport did not end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
