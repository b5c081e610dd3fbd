//go:build !oncekey_negative

package broken

// SettlementBuilt reports whether this build can break the settlement
// engine: only with -tags oncekey_negative.
const SettlementBuilt = false

// BreakSettlement would break the settlement engine of this process as m
// says; this build has no -tags oncekey_negative, so it cannot. For a mode
// that is not a settlement one it does nothing; a settlement mode panics,
// since the run's config rejects it first.
func BreakSettlement(m Mode) (restore func()) {
	if m.Settlement() {
		panic("broken: the settlement mode " + string(m) + " needs a build with -tags oncekey_negative")
	}
	return func() {}
}
