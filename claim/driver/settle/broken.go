package settle

import "github.com/oncekey/oncekey/internal/settlemode"

// brokenMode is the mode the engine settles in: settlemode.Correct, a
// constant, in every build but one with -tags oncekey_negative, where the
// negative controls break it (package settlemode).
func brokenMode() settlemode.Mode { return settlemode.Current() }
