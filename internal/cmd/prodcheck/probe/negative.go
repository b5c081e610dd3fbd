//go:build oncekey_negative

package main

import (
	"os"

	"github.com/oncekey/oncekey/internal/settlemode"
)

// brk holds the switch, which exists in a build with -tags
// oncekey_negative: taken as a value (a call would be inlined), Break is
// linked under its name for prodcheck's control build to find.
var brk = settlemode.Break

func init() {
	if len(os.Args) > 2 {
		brk(settlemode.Correct)()
	}
}
