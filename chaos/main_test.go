package chaos_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a scenario leaves a goroutine behind
// (a proxy, a downstream call, a KeepAlive, a reconciler, a redis-server
// watcher).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
