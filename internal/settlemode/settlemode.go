// Package settlemode is the process-wide switch of the settlement engine's
// broken modes (claim/driver/settle), for negative controls only: the
// engine's own tests, the entry-point conformance suite and the chaos
// runner's -negative. It lives outside claim's tree so that every module
// of the repository (the chaos runner's too) can import it.
package settlemode

import "sync/atomic"

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

var current atomic.Int32

// Current is the mode every engine of the process settles in.
func Current() Mode { return Mode(current.Load()) }

// Break makes every engine of the process settle as m until the returned
// function restores the previous mode.
func Break(m Mode) (restore func()) {
	old := current.Swap(int32(m))
	return func() { current.Store(old) }
}
