//go:build oncekey_negative

package settletest

import (
	"testing"

	"github.com/oncekey/oncekey/internal/settlemode"
)

// Break makes every settlement engine of the process settle as m until
// the returned function restores the previous mode: the negative control
// of a test that must not be parallel. Without -tags oncekey_negative it
// ends the test instead (NotBuilt).
func Break(t testing.TB, m Mode) (restore func()) {
	t.Helper()
	return settlemode.Break(m)
}
