package settle

import "sync/atomic"

// Mode is a broken settlement, for the conformance suite's negative
// controls only: each reproduces a defect an entry point once had, and the
// suite must catch every one.
type Mode int32

const (
	// Correct is the engine as it is meant to run.
	Correct Mode = iota
	// OneAttempt stops the lease and tries the write once: a short store
	// outage at completion leaves the record to a takeover that runs the
	// work again.
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
	return "settle.Mode(?)"
}

var broken atomic.Int32

func brokenMode() Mode { return Mode(broken.Load()) }

// Break makes every engine of the process settle as m until the returned
// function restores the previous mode. For negative controls in tests only.
func Break(m Mode) (restore func()) {
	old := broken.Swap(int32(m))
	return func() { broken.Store(old) }
}
