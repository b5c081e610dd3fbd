package broken

import (
	"sync/atomic"
	_ "unsafe" // go:linkname, below

	// The engine the settlement modes break; linked in for the shim.
	_ "github.com/oncekey/oncekey/claim/claimgrpc"
)

// The broken settlements: the modes of the library's settlement engine
// (claim/internal/settle, broken.go), which every entry point (claimhttp,
// claimgrpc, the message consumers, claimriver) settles its started work
// through. Under them the store is the real one; the engine is broken for
// the whole process while the scenario runs ([BreakSettlement]).
const (
	// OneAttempt stops the lease and tries the finishing write once: a
	// short store outage at completion leaves the record to a takeover
	// that runs the work again.
	OneAttempt Mode = "one-attempt"
	// ReleaseOnError releases the key for every outcome but a completion:
	// a failed, uncertain or panicked handler runs again.
	ReleaseOnError Mode = "release-on-error"
	// NoRecover neither recovers a panic nor stops the renewals after one:
	// the key is held for as long as the process lives.
	NoRecover Mode = "no-recover"
)

// settleModes maps each to the engine's own number (settle.Mode).
var settleModes = map[Mode]int32{OneAttempt: 1, ReleaseOnError: 2, NoRecover: 3}

// Settlement reports whether m breaks the settlement engine rather than
// the store.
func (m Mode) Settlement() bool { _, ok := settleModes[m]; return ok }

// settleBroken is the engine's mode (settle.broken, read on every
// settlement). The chaos module cannot import the engine's package (it is
// internal to package claim's tree), so it reaches the one variable its
// Break sets by name. This is a stopgap until the engine's switch lives
// where the chaos module may import it; settle.Mode's numbering is pinned
// by settleModes and by the negative controls, which fail if it moves.
//
//go:linkname settleBroken github.com/oncekey/oncekey/claim/internal/settle.broken
var settleBroken atomic.Int32

// BreakSettlement breaks the settlement engine of this process as m says
// until restore is called; for a mode that is not a settlement one it does
// nothing.
func BreakSettlement(m Mode) (restore func()) {
	n, ok := settleModes[m]
	if !ok {
		return func() {}
	}
	old := settleBroken.Swap(n)
	return func() { settleBroken.Store(old) }
}
