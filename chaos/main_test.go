package chaos_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a scenario leaves a goroutine behind
// (a proxy, a downstream call, a KeepAlive, a reconciler, a redis-server
// watcher). One goroutine of toxiproxy itself is not ours: when a toxic is
// added or removed while a proxied connection closes, toxiproxy's first
// (noop) stub of that link can stay blocked handing its last chunk to a
// stub that has stopped (seen once in CI, in a run with no failure). It
// lives inside the proxy library the suite uses, not in oncekey.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"))
}
