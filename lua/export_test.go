package lua

// ClaimSource returns claim.lua's source, for the benchmark's bare EVALSHA.
func ClaimSource() string { return claimSrc }

// SetDirect forces whether calls run on the caller's goroutine, for the
// overhead benchmark's canned client.
func SetDirect(s *Scripts, direct bool) { s.direct = direct }
