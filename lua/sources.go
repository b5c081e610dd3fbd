package lua

import "embed"

// Sources holds the five scripts, at the root of the file system:
// claim.lua, renew.lua, complete.lua, release.lua and syncgen.lua, and
// record.lua, the prelude that parses the record's key: a script is loaded
// as record.lua followed by the script. Each file's header comment states
// its keys, arguments, reply and re-run safety.
//
//go:embed claim.lua renew.lua complete.lua release.lua syncgen.lua record.lua
var Sources embed.FS
