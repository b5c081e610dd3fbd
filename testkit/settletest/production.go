//go:build !oncekey_negative

package settletest

import "testing"

// Break makes every settlement engine of the process settle as m until
// the returned function restores the previous mode: the negative control
// of a test that must not be parallel. This build has no -tags
// oncekey_negative, so it cannot: it ends the test (NotBuilt).
func Break(t testing.TB, m Mode) (restore func()) {
	t.Helper()
	NotBuilt(t, "the negative control "+m.String())
	return func() {}
}
