package broken

import "github.com/oncekey/oncekey/internal/settlemode"

// The broken settlements: the modes of the library's settlement engine
// (claim/driver/settle, switched by internal/settlemode), which every
// entry point (claimhttp, claimgrpc, the message consumers, claimriver)
// settles its started work through. Under them the store is the real one;
// the engine is broken for the whole process while the scenario runs
// ([BreakSettlement]), which only a build with -tags oncekey_negative can
// ([SettlementBuilt]).
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

// settleModes maps each to the engine's own mode.
var settleModes = map[Mode]settlemode.Mode{
	OneAttempt: settlemode.OneAttempt, ReleaseOnError: settlemode.ReleaseOnError, NoRecover: settlemode.NoRecover,
}

// Settlement reports whether m breaks the settlement engine rather than
// the store.
func (m Mode) Settlement() bool { _, ok := settleModes[m]; return ok }
