// Package fastpath runs the Redis fast path for package claim: typed
// wrappers of the scripts that package lua embeds ([Scripts]), the circuit
// breaker in front of them ([Breaker]), the binary encoding of a cached
// result, the key names ([KeysFor]) and the maxmemory-policy check
// ([CheckEviction]).
//
// What the scripts do, and why each is safe to run again, is written once,
// in each .lua file's header; what users configure, the key layout and the
// client settings are in package lua's documentation. This package adds
// what only Go sees: argument checks ([ErrInvalidArgument], no call made),
// the per-call timeout (which starts once the call is sent, after any wait
// in the gate's queue: see [New]), the breaker, and decoding of the replies
// ([ErrCorrupt]). Every Redis failure matches [ErrUnavailable], which
// matches durable.ErrUnavailable: the caller then goes to the durable store
// alone, with proposed generation 0.
//
// # Breaker
//
// Every wrapper goes through a [Breaker]: after [BreakerOptions.Failures]
// consecutive failed calls it opens for [BreakerOptions.CoolDown], during
// which calls return [ErrBreakerOpen] at once with no Redis call; then one
// probe call is let through (half-open), whose success closes it and whose
// failure opens it again. A call the caller's own context ended, a bad
// argument, a corrupt reply or a wait for a connection does not count as a
// failure; a call still waiting for a connection when the breaker opens
// returns [ErrBreakerOpen] unsent.
// [Scripts.Breaker] and [Options.OnStateChange] report the state for
// metrics.
//
// # Result encoding
//
// The result hash's "d" field is a compact versioned binary encoding
// (version byte 0x01, then length-prefixed fields) of the state, status,
// headers (multi-valued, nil and empty told apart), body (binary safe),
// version and resource id; encodeResult documents the layout. The same
// result always encodes to the same bytes, which complete.lua relies on to
// make a re-run a no-op.
//
// # Pipelines
//
// On a *redis.Client the wrappers send calls that queue behind the sends in
// flight as one pipeline (see [New]). The wrappers send EVALSHA and fall
// back to EVAL on NOSCRIPT (a restarted server, a new cluster node), in
// their own pipelines too, one call at a time; a pipeline the application
// sends has no such fallback. Call [Scripts.Load] before sending the
// scripts in a pipeline of your own.
package fastpath
