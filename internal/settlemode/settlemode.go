// Package settlemode is the process-wide switch of the settlement engine's
// broken modes (claim/driver/settle), for negative controls only: the
// engine's own tests, the entry-point conformance suite and the chaos
// runner's -negative. It lives outside claim's tree so that every module
// of the repository (the chaos runner's too) can import it.
//
// The switch exists only in builds with -tags oncekey_negative. In any
// other build (every application's) Current is the constant Correct, the
// engine's broken branches are dead code the compiler removes, and there
// is no Break and no variable to set.
package settlemode

// Mode is a broken settlement: each reproduces a defect an entry point
// once had, and the suites must catch every one.
type Mode int32

const (
	// Correct is the engine as it is meant to run.
	Correct Mode = iota
	// OneAttempt stops the lease and tries the finishing write once: a
	// short store outage at completion leaves the record to a takeover
	// that runs the work again.
	OneAttempt
	// ReleaseOnError releases the key for every outcome but a completion:
	// a failed or uncertain handler runs again.
	ReleaseOnError
	// NoRecover neither recovers a panic nor stops the renewals after one:
	// the key is held for as long as the process lives.
	NoRecover
)

func (m Mode) String() string {
	switch m {
	case Correct:
		return "correct"
	case OneAttempt:
		return "one-attempt"
	case ReleaseOnError:
		return "release-on-error"
	case NoRecover:
		return "no-recover"
	}
	return "settlemode.Mode(?)"
}
