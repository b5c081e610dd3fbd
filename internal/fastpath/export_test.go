package fastpath

// ClaimSource returns claim.lua's source as loaded, for the benchmark's
// bare EVALSHA.
func ClaimSource() string { return Source("claim.lua") }

// SetDirect forces whether calls run on the caller's goroutine, for the
// overhead benchmark's canned client.
func SetDirect(s *Scripts, direct bool) { s.direct = direct }

// CountPoolWait removes s's gate: a call then waits for a connection
// inside its per-call timeout, as before the gate. For negative controls.
func CountPoolWait(s *Scripts) { s.gate = nil }

// LaggedCalls returns how many of s's calls timed out while this process
// lagged, and so were not counted by the breaker.
func LaggedCalls(s *Scripts) int { return int(s.lagCalls.Load()) }

// ScriptSHA returns the SHA1 of package lua's script name, as loaded.
func ScriptSHA(name string) string { return script(name).Hash() }
