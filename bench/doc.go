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
//   - fresh: unique keys, claim → complete through [claim.Claimer.Do] with
//     an empty business write. Floor: the library's own claim and
//     completion statements (captured from it at start-up), issued with pgx
//     in one transaction.
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
// servers' CPU is not in it) and the throughput ratio to its floor.
//
// A correctness failure (a key executed twice, a request that failed, a
// floor that did not see what it expects) makes the tool exit with status 1.
// Speed never does: -smoke runs every workload for about two seconds, for
// CI, without judging the figures.
package main
