// Command bench measures oncekey's claim path against its physical floors,
// side by side in one process, and prints a table (and, with -json, a
// report) of the figures.
//
//	go run ./bench [-redis URL] [-postgres URL] [-workload NAME[,NAME]] [-concurrency N]
//	               [-duration D] [-json FILE] [-html FILE] [-smoke]
//	               [-rate N [-max-inflight N] [-open-round D]]
//	               [-knee [-knee-p99 D] [-knee-rates N,N,...] [-knee-step D]]
//
// For example:
//
//	go run ./bench -duration 6s -json bench.json      # closed loop, every workload
//	go run ./bench -workload fresh,replay -rate 1000  # open loop at 1000 requests/s
//	go run ./bench -workload fresh,replay -knee       # open-loop knee sweep
//	go run ./bench -smoke -html bench.html            # plots in one HTML file
//	go run ./bench -records 10000000                  # a record's size on disk
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
// -records N measures a record instead of running workloads: 1000 records
// written through Do, copied (new key hashes and operation digests, times
// a second apart) up to N, VACUUM ANALYZE, then bytes per record of
// the table's heap, its TOAST, each index and the whole.
//
// -html FILE writes one self-contained HTML page (inline SVG drawn with
// gonum.org/v1/plot; no script, nothing fetched to view it): per workload,
// the p50, p99 and p99.9 latency of each variant on a log axis, for the
// closed-loop run and each open-loop run (-rate), and for each knee sweep
// (-knee) the p99 of every step against the throughput achieved, per
// variant, with the p99 bound.
//
// # Workloads
//
//   - fresh: unique keys through [claim.Claimer.Do], whose business write
//     is one INSERT into a small orders table the tool creates in its
//     schema. library and library-no-redis run Do's default on PostgreSQL
//     since issue 44, locking first: one round trip sends the BEGIN (with
//     its SET LOCALs), the key's advisory lock and the check that no record
//     exists (one simple-protocol message), then fn's INSERT, then the
//     finished record's INSERT pipelined with the COMMIT; with Redis,
//     claim.lua before and complete.lua after (at 7bab721 waited for,
//     with syncgen.lua, confirming the lease, sent from a goroutine while
//     fn ran; whether Do waits for complete.lua and sends syncgen.lua has
//     changed since, so floor-lock-first-redis sends what Do sent at
//     start-up). Each
//     has its throughput ratio to floor-lock-first (target 0.90) and its
//     cost ratio to floor-business-tx (issue 30: at most 1.9 with Redis,
//     1.7 without); library's cost ratio to floor-lock-first-redis is
//     printed beside them, and names that floor in its "missed" lines.
//     library-at-commit and library-at-commit-no-redis, the same with
//     [claim.WithWriteAtCommit] (the finished record inserted with the
//     COMMIT, no lock), against floor-sql (target 0.85) and at most 1.45 and
//     1.3 of floor-business-tx. Floors: floor-lock-first, Do's statements
//     (the BEGIN with the lock and the check, captured from Do at start-up
//     and rebuilt for each key from the values it interpolates: the lock,
//     the digest, the generation; a second Do, with Redis, is checked to
//     send exactly that; the record INSERT, captured) issued with pgx, at
//     the generation Do proposes without Redis;
//     floor-lock-first-redis, the same between the bare EVALSHAs Do sends
//     around it, as one Do at start-up sent them (logged): claim.lua, then
//     complete.lua with the result Do caches (SHAs, result and TTL
//     captured), waited for, or sent from a goroutine and not waited for
//     when Do sent it after its answer; and syncgen.lua when Do sent it,
//     from a goroutine once the BEGIN returned, its answer not read; all
//     at claim.lua's generation: the floor of a fresh Do with Redis (a
//     call it did not wait for that failed fails its next request);
//     floor-lock-first-digest-key, floor-lock-first
//     on a second table of the tool's schema carried over by migration
//     007's contract step (oncekey migrate contract: the operation digest
//     as the primary key), against library-digest-key and
//     library-no-redis-digest-key (Do on that table), with the same
//     targets. The claim-first floors, Do's default before issue 44, now
//     what Do sends for a key whose record exists unfinished and what the
//     workflow (Claim, the caller's transaction, Lease.Complete) sends in
//     one transaction, every claim now taking the key's lock too:
//     floor-claim-first (BEGIN, the full claim a Claim sends without Redis,
//     the order INSERT, the completion with COMMIT in one pipeline), whose
//     cost ratio has issue 30's ceiling of 1.5; floor-claim-new, the same
//     with the insert a Claim sends for a key Redis granted
//     (ClaimParams.ExpectNew) instead of the full claim (the claims and the
//     completion captured from Claim and Lease.Complete at start-up);
//     floor-claim-new-redis, floor-claim-new between claim.lua and
//     complete.lua (no syncgen.lua);
//     floor-claim-in-begin, floor-claim-new with the insert sent in the
//     query that opens the transaction (one round trip fewer), through a
//     PL/pgSQL function the tool creates in its schema (its plan prepared
//     once per connection) called with literal, hex-encoded arguments,
//     measured, not used by the library (beginclaim.go);
//     floor-slim-claim-first and floor-slim-pending-claim-first,
//     floor-claim-new's statements, without the lock, on issue 30.4's slim
//     record (the
//     operation digest as the primary key, compact columns, fillfactor 80:
//     slim.go), the first with a B-tree on the expiry alone (HOT
//     completions, no index for Pending), the second with today's partial
//     sweep and pending indexes (non-HOT completions): what the record
//     could cost once the library moves to it; floor-sql, the write at commit's own
//     BEGIN and record INSERT (captured likewise) with the same order
//     INSERT, the last two in one pipeline;
//     floor-sql-pk-only, the same into a copy of the record's table with its
//     primary key alone (no secondary index, no CHECK constraint);
//     floor-key-row, the same with the record replaced by a bare 32-byte key
//     in a table that has it as its primary key and nothing else (the least
//     any record written with the business write can cost); and
//     floor-business-tx, BEGIN, the INSERT, COMMIT with no idempotency at
//     all: what the same write costs a service without oncekey. The floors
//     report their cost ratio to floor-business-tx: together they split
//     what the library's record costs the database into any row, the
//     record's columns and its indexes. Issue 44 adds a realistic
//     business transaction beside that minimal one (realistic.go), on four
//     tables of the tool's schema:
//     sales_orders (bigserial key, customer_id indexed, created_at,
//     status, total), order_lines (bigserial key, order_id a foreign key,
//     indexed, sku, qty, price), stock (sku primary key, on_hand; 5,000
//     SKUs) and ledger (bigserial key, account_id indexed, amount, ref
//     unique: the request's key, created_at). Its statements: the order
//     INSERT returning its id, one INSERT of its two lines, the UPDATE of
//     one SKU's stock chosen at random (on_hand - the first line's qty),
//     the ledger INSERT. floor-realistic-tx sends them bare between BEGIN
//     and COMMIT, as floor-business-tx does its INSERT; library-realistic
//     and library-no-redis-realistic run the same body as Do's fn (with
//     and without Redis); library-claim-complete-realistic, the workflow:
//     Claim (with Redis), the transaction on its own, Lease.Complete. They
//     alternate with the other variants in the same rounds. Issue 44's
//     targets, printed under the table with a "missed" line each: Do
//     without Redis at most 1.3× floor-realistic-tx and (library-no-redis)
//     1.8× floor-business-tx; with Redis 1.4× and (library) 2.0×; the
//     caller's p50 with Redis at most 1.3× without, judged on both
//     transactions; Claim + Complete's cost ratio to both floors, reported
//     only. A missed ceiling on the minimal transaction is bounded by
//     floor-lock-first (without Redis) or floor-lock-first-redis (with);
//     one on the realistic transaction by an estimate from the same run:
//     what that floor adds to floor-business-tx a request (1/throughput),
//     added to floor-realistic-tx's; a missed p50 by the p50
//     floor-lock-first-redis adds to floor-lock-first. Checks: every key
//     a realistic variant answered executed has one ledger row (warm-up
//     included), the orders equal those keys, two lines per order, and
//     the stock taken equals the quantities of those keys (the UPDATE
//     applied once per key).
//   - storm: K keys, M duplicates each, N workers taking requests in order,
//     so the duplicates of a key are in flight together. Checks that each
//     key executed exactly once, and, claiming first, that fn ran once per
//     key; counts durable claims per key. Floors: a bare EVALSHA of the
//     library's claim.lua (its SHA captured from the library's first call),
//     and the library with Redis off, claiming first (library-no-redis) and
//     with the write at commit (library-at-commit-no-redis, whose fn runs
//     are reported). The Redis-only peer, peer-redislock: bsm/redislock's
//     Obtain (one EVALSHA of its SET NX PX script, no retry) of the same
//     keys, which stores no result and reads no database (peer.go); the
//     library's throughput against it has a target of 0.95, in the storm
//     and in the burst. Then the burst: each key's duplicates released
//     together on a pool of 20, the library with default lua.Options
//     against the bare EVALSHA and the peer, each on a client of its own.
//   - replay: completed keys retried. Floors: the bare EVALSHA (answered
//     from the Redis cache), the library's claim statement alone, and a
//     bare SELECT of the stored result; the peer's Obtain of a key it
//     holds, reported against the library without a target.
//   - redis-down: the library against an unresponsive Redis (breaker open)
//     versus the library with Redis off; before that, the latency of the
//     first requests while the breaker opens, for a refused and for a
//     black-holed Redis.
//   - sweep: fresh claims without and with a concurrent Sweep of a large
//     expired backlog; claim p99 either way and rows swept per second.
//   - finished-burst (issue 43): bursts of 50 concurrent retries (Do, the
//     same key and fingerprint, on the Redis Claimer) of a finished
//     operation Redis cannot answer: large, whose 96 KiB result is too large
//     for Redis to cache (lua.Options.MaxCachedBody, 64 KiB by default);
//     lost, a small result whose Redis key is deleted before each burst.
//     Checks that every retry of every burst was Replayed (an InProgress
//     answer, fn running or another answer fails the run). Target: the
//     burst's p99 (each retry's latency from the burst's release) at most
//     2× the p99 of floor-select, a bare SELECT of the record sent one at a
//     time (the replay workload's floor); beside it, the library's single
//     replay from PostgreSQL, a Claim on the Claimer without Redis, one at a
//     time, reported with its own ratio.
//   - wake (issue 43): a holder takes a fresh key (Claim and a Lease, or,
//     do-*, Do whose fn blocks), 20 duplicates wait on it (Claim, or Do,
//     on a Claimer with claim.WithWait(2s)), and the holder commits after a
//     hold drawn from 20-200ms (Lease.Complete, or fn returns). Each
//     duplicate's latency runs from when the holder's commit returned (the
//     end of the completion, or of the COMMIT after it, that leaves its
//     connection out of a transaction, seen by the pgx tracer; an answer
//     before it counts 0) to its answer. The holder runs on a Claimer of its
//     own (another instance of the service), except in
//     claim-redis-one-claimer, where it shares the duplicates'. Floors: the
//     same holder, then 20 duplicates (Claim) sent the instant its call
//     returned, timed from its commit likewise. With Redis up, targets: p50
//     at most 5ms, p99 at most 50ms; with Redis down (*-redis-down: both
//     Claimers on a refused port, their breakers open) figures only. Checks
//     that every duplicate was Replayed; reports the spread from a trial's
//     first to its last answer and how long after its commit the holder's
//     call returned.
//
// finished-burst and wake time their variants themselves (a burst, a
// trial) rather than in the closed loop below, but alternate them the same
// way: one untimed warm-up round each, then rounds in rotating order until
// -duration is spent, each round booked into the variant's row of the
// table (latency, Redis calls, statements, allocations and CPU per
// request). Their targets are printed under the table, with a "missed"
// line saying what bounds each miss in the same run.
//
// # Method
//
// Each workload alternates its variants in short rounds (the order rotating
// every round), so drift on a shared machine hits all of them alike; only
// ratios measured in the same run mean much. Every variant gets one untimed
// warm-up round. Each variant's share of -duration is split into the
// whole number of -round long rounds nearest to it (at least one): fresh's
// 23 variants get two rounds of 217ms from -duration 10s at the default
// -round 250ms, four of 109ms at -round 100ms (bench/README.md's command). Per variant the tool reports throughput, p50/p99/p99.9
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
// reported, never a failure. Under the table, a "missed" line for each
// says from the same run what bounds it: for a throughput ratio, what a
// request spends beyond its floor's (this process's CPU, Redis calls,
// statements, allocations); for a cost ceiling, whether the variant's own
// floor already costs more than the ceiling (the protocol's statements on
// today's record bound it) or the library's share misses it.
//
// # Open loop
//
// The closed loop above (each worker sends its next request when the last
// returns) hides queueing: a stalled server stalls the workers too, and the
// requests that would have arrived meanwhile are never sent, so never slow
// (coordinated omission). -rate N runs the open-loop variants of fresh
// (library, library-no-redis, floor-sql, floor-business-tx) and replay
// (library, floor-evalsha) on a fixed arrival schedule instead: request k
// is due at start + k/N whether or not the earlier ones have returned, and
// runs in its own goroutine. A request's latency runs from when it was due,
// not from when it started, so a late dispatch counts against it too. At
// most -max-inflight (10000) requests are in flight; a request due beyond
// that is dropped, not sent, and counted. Like the closed loop, the
// variants alternate in rounds (-open-round, 1s), the order rotating, each
// after one untimed warm-up round, until each has had its share of
// -duration; each round waits for its last request, so no queue spills into
// the next variant's round. The tool reports, per variant, p50/p99/p99.9
// from the due times, the requests sent and dropped, and the achieved
// rate: successful requests over the time from each round's start to its
// end or its last completion, whichever is later, which falls under N once
// the variant cannot keep up.
// Without -smoke, -rate and -knee replace the closed-loop run, and name
// fresh and replay (the workloads they run) by default.
//
// -knee sweeps the same variants through -knee-rates (default 250/s
// doubling to 64000/s), -knee-step (2s) of open loop per variant and rate,
// the variants alternating in rounds at each rate. A step exceeds the
// bound when its p99 is above -knee-p99 (default 50ms: on the 2-core
// shared machine of bench/README.md's measurements, with PostgreSQL committing
// with fsync, fresh's p99 at 250/s was 10-40ms, and a trial with a 20ms
// bound left two of fresh's four variants with no knee), or a request was
// dropped or failed. A
// variant stops stepping after two steps in a row exceed the bound. Its
// knee is the highest rate whose step stayed within the bound ("none":
// none did; "≥": none exceeded it, so the knee is past the rates tried),
// reported with the p99 of every step and the ratio of the library's knee
// to its floors'. At low rates a step holds few requests (500 at 250/s, so
// the p99 is the sixth-worst): a longer -knee-step steadies it.
//
// # Failures
//
// A correctness failure (a key executed twice, a request that failed, a
// floor that did not see what it expects) makes the tool exit with status 1.
// Speed never does: -smoke runs every workload for about two seconds, then
// fresh and replay open-loop at 100 requests/s for about two seconds each,
// for CI, without judging the figures.
package main
