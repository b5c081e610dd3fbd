package settle

import "github.com/oncekey/oncekey/internal/settlemode"

// Mode is a broken settlement, for negative controls only (see package
// settlemode, where the process-wide switch lives).
type Mode = settlemode.Mode

// The broken modes.
const (
	Correct        = settlemode.Correct
	OneAttempt     = settlemode.OneAttempt
	ReleaseOnError = settlemode.ReleaseOnError
	NoRecover      = settlemode.NoRecover
)

func brokenMode() Mode { return settlemode.Current() }

// Break makes every engine of the process settle as m until the returned
// function restores the previous mode. For negative controls in tests only.
func Break(m Mode) (restore func()) { return settlemode.Break(m) }
