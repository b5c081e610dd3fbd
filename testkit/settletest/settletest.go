// Package settletest holds the negative controls of the settlement engine
// that every entry point's conformance test runs, and the fixtures of the
// settlement tests: a migrated PostgreSQL store (Store) and a store whose
// lease writes fail on demand (Flaky).
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package settletest

import (
	"testing"

	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/testkit/entrytest"
)

// CatchBroken runs the negative control of every broken mode of the
// settlement engine (settle.Break) against d, each through the window
// that reveals it: one completion attempt only (a short store outage at
// completion runs the work twice), release on error (a resolved uncertain
// operation runs again), no recover (a panic holds the key). The suite
// must report each. The modes break the whole process: the caller's test
// must not be parallel.
func CatchBroken(t *testing.T, d entrytest.Driver) {
	for _, c := range []struct {
		mode   settle.Mode
		window string
	}{
		{settle.OneAttempt, entrytest.OutageShort},
		{settle.ReleaseOnError, entrytest.Resolve},
		{settle.NoRecover, entrytest.Panic},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			entrytest.Catch(t, d, c.window, func() func() { return settle.Break(c.mode) })
		})
	}
}
