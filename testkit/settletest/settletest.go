// Package settletest holds the negative controls of the settlement engine
// that every entry point's conformance test runs, and the fixtures of the
// settlement tests: a migrated PostgreSQL store (Store) and a store whose
// lease writes fail on demand (Flaky).
//
// The engine can be broken (Break) only in a build with -tags
// oncekey_negative; in any other build a negative control fails its test
// under CI=true and skips it otherwise (NotBuilt).
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package settletest

import (
	"testing"

	"github.com/oncekey/oncekey/internal/settlemode"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Mode is a broken settlement of the engine, for negative controls only.
type Mode = settlemode.Mode

// The broken modes (package settlemode says what each breaks).
const (
	OneAttempt     = settlemode.OneAttempt
	ReleaseOnError = settlemode.ReleaseOnError
	NoRecover      = settlemode.NoRecover
)

// NotBuilt ends a test that asks for a negative control of the
// settlement engine (what names it) in a build without -tags
// oncekey_negative, where the engine cannot be broken: it fails the test
// under CI (CI=true), where a negative control that cannot run proves
// nothing, and skips it otherwise.
func NotBuilt(t testing.TB, what string) {
	t.Helper()
	msg := "built without -tags oncekey_negative: " + what + " breaks the settlement engine, which only a build with that tag can (go test -tags oncekey_negative)"
	if testenv.CI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// CatchBroken runs the negative control of every broken mode of the
// settlement engine (Break) against d, each through the window that
// reveals it: one completion attempt only (a short store outage at
// completion runs the work twice), release on error (a resolved uncertain
// operation runs again), no recover (a panic holds the key). The suite
// must report each. The modes break the whole process: the caller's test
// must not be parallel. In a build without -tags oncekey_negative each
// fails under CI and skips otherwise (NotBuilt).
func CatchBroken(t *testing.T, d entrytest.Driver) {
	for _, c := range []struct {
		mode   Mode
		window string
	}{
		{OneAttempt, entrytest.OutageShort},
		{ReleaseOnError, entrytest.Resolve},
		{NoRecover, entrytest.Panic},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			entrytest.Catch(t, d, c.window, func() func() { return Break(t, c.mode) })
		})
	}
}
