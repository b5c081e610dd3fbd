// Package fault holds the fault injectors of the chaos suite, each small and
// usable on its own, in tests or in the chaos runner:
//
//   - [Proxy]: an in-process TCP proxy (toxiproxy as a library) in front of
//     Redis or PostgreSQL that adds latency, blackholes traffic (accepts and
//     never answers), cuts every connection, or cuts a connection after N
//     bytes of reply.
//   - [Pair]: a primary and a replica of the suite's own (testkit/redisproc
//     processes, which are restarted empty and paused with SIGSTOP, or any
//     [Node], such as the chaos runner's containers), failed
//     over to a replica that missed writes ([Pair.PauseReplication],
//     [Pair.Failover]) or split-brained; [Fill] pushes a server run under
//     maxmemory with allkeys-lru into evicting keys.
//   - [Terminate]: pg_terminate_backend of a library connection in the middle
//     of its transaction.
//   - [VanishLease]: a Redis clock jump simulated by its effect, the lease
//     expiring early (PEXPIRE lease 1).
//   - [ScriptSends]: counts the scripts a go-redis client puts on the wire,
//     so a delayed reply that makes the client re-send a script is seen.
//   - [SkewedClock]: a worker clock far off, for the only clock the library
//     accepts (the Redis breaker's clock, set with the internal
//     fastpath.Hooks.Now). The library reads no worker clock for any lease
//     decision, so the skew must change nothing.
//   - [Pause]: a worker paused the way a GC pause or a stopped VM pauses it.
//   - [Downstream]: an HTTP dependency of the suite that fails, times out after
//     doing the work, or answers slowly, deduplicating by operation identity
//     and fencing by generation as the design asks downstream systems to.
//
// A COMMIT (or the next statement) whose reply is lost after the server
// applied it is testkit/pgproxy's Cutter, shared with the durable/postgres
// tests.
//
// Every injector counts what it did, so a scenario can prove its faults
// fired. None of them logs or names a raw idempotency key.
package fault
