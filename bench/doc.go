// Command bench measures oncekey's claim path against its physical floors,
// side by side in one process, and prints a table (and, with -json, a
// report) of the figures.
//
//	go run ./bench [-redis URL] [-postgres URL] [-workload NAME[,NAME]] [-concurrency N]
//	               [-duration D] [-json FILE] [-smoke]
//
// The URLs default to REDIS_URL and DATABASE_URL, else to the local servers
// (redis://127.0.0.1:6379/0 and
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable). The tool
// creates its own PostgreSQL schema and Redis key prefix and removes both
// at exit. -duration (default 10s) is the measured time of one workload,
// shared by its variants; setup and warm-up come on top. -h lists the
// sizing flags (-dups, -keys, -replay-keys, -backlog, -round, -pg-conns,
// -redis-timeout) and -cpuprofile / -memprofile for pprof.
//
// # Workloads
//
//   - fresh: unique keys, claim → complete through [claim.Claimer.Do],
//     whose business write is one INSERT into a small orders table the tool
//     creates in its schema. Floors: floor-2stmt, the library's own BEGIN,
//     claim and completion statements (captured from it at start-up, which
//     checks that the INSERT comes between the claim and the completion)
//     with the same INSERT, issued with pgx in one transaction; and
//     floor-business-tx, BEGIN, the INSERT, COMMIT with no idempotency at
//     all: what the same write costs a service without oncekey. Besides the
//     throughput ratio to floor-2stmt, the library is judged by its cost
//     ratio to floor-business-tx (that floor's throughput over the
//     library's: how many times more a request costs), at most 1.3 without
//     Redis and 1.45 with it.
//   - storm: K keys, M duplicates each, N workers taking requests in order,
//     so the duplicates of a key are in flight together. Checks that each
//     key executed exactly once and counts durable claims per key. Floors:
//     a bare EVALSHA of the library's claim.lua (its SHA captured from the
//     library's first call), and the library with Redis off.
//   - replay: completed keys retried. Floors: the bare EVALSHA (answered
//     from the Redis cache), the library's claim statement alone, and a
//     bare SELECT of the stored result.
//   - redis-down: the library against an unresponsive Redis (breaker open)
//     versus the library with Redis off; before that, the latency of the
//     first requests while the breaker opens, for a refused and for a
//     black-holed Redis.
//   - sweep: fresh claims without and with a concurrent Sweep of a large
//     expired backlog; claim p99 either way and rows swept per second.
//
// # Method
//
// Each workload alternates its variants in short rounds (the order rotating
// every round), so drift on a shared machine hits all of them alike; only
// ratios measured in the same run mean much. Every variant gets one untimed
// warm-up round. Per variant the tool reports throughput, p50/p99/p99.9
// latency (a log-linear histogram, ±1.6%), Redis commands and SQL
// statements per request (a go-redis Hook and a pgx QueryTracer; BEGIN and
// COMMIT are statements), allocations per request (runtime.MemStats Mallocs
// over the round, the harness's own key building included: two or three
// allocations), this process's CPU time per request (getrusage; the
// servers' CPU is not in it), the throughput ratio to its floor and, where
// set, the cost ratios to other floors. Each workload runs with
// -concurrency (32) workers, each sending its next request when its last
// returns: a closed loop.
//
// Targets are floors or ceilings: a throughput ratio must reach its
// target ("≥" in the table, "target" in the JSON), a cost ratio must stay
// at or under its own ("≤", "costs" with "at_most"). A missed target is
// reported, never a failure.
//
// A correctness failure (a key executed twice, a request that failed, a
// floor that did not see what it expects) makes the tool exit with status 1.
// Speed never does: -smoke runs every workload for about two seconds, for
// CI, without judging the figures.
package main
