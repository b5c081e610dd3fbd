package lua

import "embed"

// Sources holds the five scripts, at the root of the file system:
// claim.lua, renew.lua, complete.lua, release.lua and syncgen.lua. Each
// file's header comment states its keys, arguments, reply and re-run
// safety.
//
//go:embed claim.lua renew.lua complete.lua release.lua syncgen.lua
var Sources embed.FS
