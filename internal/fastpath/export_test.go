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

// CountPoolWait removes s's pool gate: a call then waits for a connection
// inside its per-call timeout, as before the gate. For negative controls.
func CountPoolWait(s *Scripts) { s.turns = nil }
