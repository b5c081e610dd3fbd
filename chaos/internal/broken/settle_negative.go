//go:build oncekey_negative

package broken

import "github.com/oncekey/oncekey/internal/settlemode"

// SettlementBuilt reports whether this build can break the settlement
// engine: only with -tags oncekey_negative.
const SettlementBuilt = true

// BreakSettlement breaks the settlement engine of this process as m says
// until restore is called; for a mode that is not a settlement one it does
// nothing.
func BreakSettlement(m Mode) (restore func()) {
	n, ok := settleModes[m]
	if !ok {
		return func() {}
	}
	return settlemode.Break(n)
}
