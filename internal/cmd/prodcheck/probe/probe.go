// Command probe links the library's packages that run the settlement
// engine, as an application does: prodcheck builds it with and without
// -tags oncekey_negative and reads its symbols. It is never run.
package main

import (
	"context"
	"os"

	"github.com/oncekey/oncekey/claim/claimhttp"
	_ "github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/claim/driver/settle"
)

func main() {
	if len(os.Args) < 2 {
		return
	}
	// Not reached when run without arguments: the calls link the engine's
	// code (the linker drops what nothing calls), as an application's
	// calls would.
	var e settle.Engine
	e.Run(context.Background(), nil, nil, nil)
	_, _ = claimhttp.Middleware[struct{}](nil, nil)
}
