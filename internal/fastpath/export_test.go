package fastpath

import "github.com/oncekey/oncekey/lua"

// ClaimSource returns claim.lua's source, for the benchmark's bare EVALSHA.
func ClaimSource() string {
	b, err := lua.Sources.ReadFile("claim.lua")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// SetDirect forces whether calls run on the caller's goroutine, for the
// overhead benchmark's canned client.
func SetDirect(s *Scripts, direct bool) { s.direct = direct }
