// Package chaos forces the failure windows of oncekey and proves, with an
// independent checker, that the guarantee holds through them: at most one
// effect per logical operation, and every retry answered with the same
// result. It is a test suite and a product feature: operators run it
// against their own Redis and PostgreSQL (go run ./chaos/cmd/chaos) before
// trusting a lease length.
//
// # Scenarios
//
// [Scenarios] lists them: the ten ambiguity windows of DESIGN.md (two of
// them again over HTTP, with claim/claimhttp's middleware and retrying
// Transport; in stale-owner the owner pauses right before its durable
// completion, after every check of its own, so the completion it sends
// after the takeover is the one the fence must reject); the windows of the
// middleware's rule after a workflow handler started, over HTTP, each
// counting the calls that reached the downstream (at most one per key):
//
//   - http-client-timeout: work longer than the lease outlives every
//     client's timeout; the lease is kept alive, the retries replay;
//   - http-client-disconnect: the clients disconnect right after the
//     effect; their retries arrive while the work goes on and must wait;
//   - http-renewals-fail: renewals refused for longer than the lease;
//     nobody takes over, the fenced completion still succeeds;
//   - http-panic-after-effect: marked uncertain, reconciled, never rerun;
//   - http-oversized-response: over MaxResponseBody, stored by status
//     without body, answered and replayed alike;
//   - http-finish-outage-short: Complete refused for less than
//     FinishTimeout: retried, answered as usual;
//   - http-finish-outage-long: refused past FinishTimeout but within the
//     lease: 202, in progress, completed in the background;
//
// then the same windows through every other entry point, one scenario per
// adapter (grpc-windows, nats-windows, amqp-windows, kafka-windows,
// river-windows): per operation the store refusing the finishing write for less than the lease
// and for longer, renewals refused, a panic after the effect, the caller
// gone, a duplicate during the work, work past the transport's own timer
// (the call's deadline, AckWait, a closed consumer connection, the job's
// timeout), and an uncertain outcome resolved, then replayed in the
// adapter's format; every operation must end completed, with one effect;
//
// then bursts of concurrent retries of finished operations, some with
// results over the 64 KiB Redis caches, with the scenario's Redis keys
// deleted before and during each burst: every retry replays, none is told
// "in progress" (finished-bursts, issue 43); duplicates of a Do reaching
// PostgreSQL while the first one's function holds its transaction, Redis
// down or the key deleted from Redis inside that transaction: each waits
// on the key's lock and replays, the function never runs twice at once
// (do-duplicates, issue 44);
//
// then an uncertain operation reconciled after its retention and replayed,
// never rerun (reconcile-after-retention), and a dead worker's record the
// Reconciler cannot resolve yet kept uncertain, never rerun, settled once
// known (reconcile-unresolved); then Redis restarted empty,
// failed over to a replica that missed writes, split-brained, down,
// evicting, and re-running scripts after delayed replies; PostgreSQL
// backends terminated before a commit and commits whose acknowledgement is
// lost; owners paused past their lease; worker clocks far off; then
// PostgreSQL itself: latency and a partition beyond the lease before a
// commit (pg-network), and on throwaway clusters (initdb, pg_ctl,
// pg_basebackup -R) a SIGKILL of every server process (pg-crash) and a
// failover to a synchronous standby (pg-failover-sync). The hazards
// pg-crash-async-commit and pg-failover-async (synchronous_commit=off, an
// asynchronous standby) run only when named and must be caught. Last,
// the stores as production runs them: Redis behind three sentinels with
// its primary killed (redis-sentinel), and both stores over TLS verified
// against a CA made at run time, a wrong CA refused (tls); then a
// three-node Patroni cluster with synchronous_mode (etcd as its DCS): the
// leader killed (patroni-kill-leader), cut off from etcd
// (patroni-dcs-partition) and switched over (patroni-switchover); the
// hazard patroni-async-failover, without synchronous_mode, must be caught.
//
// The infrastructure scenarios (pg-failover-sync, pg-crash, pgbouncer,
// redis-sentinel, the Patroni ones) cycle their fault for the whole run
// (issue 48), on a plan drawn from the seed, healed between faults (the
// old primary rejoined as a standby, failing back at the next cycle); a
// result counts its main fault ([Result.Repeated]) and fails below
// [RepeatedFaultsRequired] (2 at 20 operations, 20 at 1000). The
// nemesis mixes every fault family of its servers, overlapping, under a
// mixed load: Redis restarted, flushed, frozen, failed over; PostgreSQL
// failed over and back, crashed, partitioned, slowed, a reply lost;
// holders paused past their lease; the downstream's answer lost; worker
// clocks skewed and Redis leases vanishing. Each scenario's faults are
// spans on [Result.Timeline], which the runner's -html draws.
//
// Each scenario runs Iterations logical operations, each retried at once by
// Clients clients (each with a Claimer and a Redis client of its own, like
// instances of one service), with capped exponential backoff and full
// jitter, Parallel operations at a time. Operations run with [claim.Claimer.Do]
// (the effect written in the claim's transaction), as workflows (Claim, a
// call to the suite's downstream HTTP service with the operation identity
// and the fencing token, a fenced Complete), or through HTTP. Faults are
// injected (package chaos/internal/fault, and a durable store that refuses chosen fenced
// writes for a while) on a schedule drawn from the seed: the same seed
// draws the same schedule (which operation gets which fault, with which
// parameters); thread interleavings differ from run to run, which is the
// point of running many iterations.
//
// After the faults healed, every operation is retried once more through a
// clean Claimer: an acknowledged result must come back byte for byte.
//
// # History and checker
//
// Every call is recorded (package chaos/internal/history) with its start, end, outcome,
// token and the hash of its result, and every run of Do's function with its
// start and end in process; every business effect goes to a table
// without a unique constraint, so a duplicate would be visible (the edge
// scenarios' downstream does not deduplicate either, and they count the
// calls that reached it); a sampler
// reads the durable generations while the scenario runs. The checker
// then verifies the invariants, among them linearizability of each
// operation against a model of the record (porcupine, timed-out calls
// given an open end), and that no call sent after its operation finished
// (in real time: after a completion's or a replay's answer arrived) was
// told "in progress" or "uncertain", and that no run of Do's function
// started while another of the same operation ran under the key's lock
// (Do without WithWriteAtCommit). A scenario fails on any violation,
// and also when a kind of fault it injects never fired: a scenario whose
// faults did not fire proved nothing.
//
// # Negative control
//
// [NegativeControl] runs scenarios against a deliberately broken store,
// one bug per rule; [NegativeModes] lists the scenarios that must catch
// each:
//
//   - complete-without-fence: completions without the fence (caught by
//     stale-owner, paused-owner, clock-skew, nemesis);
//   - claim-trusts-redis: claims that trust Redis and overwrite the record
//     (redis-restart, redis-down, pgbouncer);
//   - release-after-start: the key given back after work started under a
//     lease: MarkUncertain releases, and so does a renewal or a finish
//     that could not be written (http-renewals-fail,
//     http-panic-after-effect, http-finish-outage-long,
//     reconcile-after-retention);
//   - no-reread-after-lost-ack: a COMMIT or fenced finish whose reply was
//     lost taken as not applied, without re-reading (db-cut-after-commit,
//     nemesis);
//   - worker-clock-lease: leases set and compared by the worker's skewed
//     clock instead of the database's (clock-skew, which watches that no
//     claim takes over a lease before it could have run out by the
//     database's clock);
//   - unresolved-stays-processing: a dead worker's record that the
//     Reconciler adopted and could not resolve left processing under its
//     lease instead of uncertain, so a retry takes it over once that lease
//     ran out and runs the work again (reconcile-unresolved);
//   - expires-in-inflated: a live record's remaining life reported an
//     hour longer than it is, so the replay caches (in process and
//     Redis's refilled copies) keep a result past its record and replay a
//     key's previous life (replay-cache);
//   - replay-ignores-fingerprint: a claim that found a finished record of
//     another payload answers it as the caller's own, so a reused key
//     replays the first payload's result (mismatch, no-redis; in no-redis
//     only the model's rule that a replay goes to the payload that stored
//     it catches it);
//   - do-skips-lock: Do's transaction runs the function without the key's
//     lock and the check that no record exists (LockFirst dropped), so a
//     duplicate that reaches the database runs it beside the first, its
//     writes then rolled back: only the checker's one-fn-run-at-a-time,
//     from the runs of the function the suite records, sees it
//     (do-duplicates, no-redis).
//
// Two more break the Claimers' Redis clients rather than the store:
//
//   - retry-takes-lease: every lease claim.lua grants confirmed the moment
//     it is granted (a go-redis hook on each Claimer's client), with
//     confirmed leases trusted (TrustLease) as before issue 43: a retry of
//     a finished operation whose result Redis does not hold takes a lease
//     only to replay, and the retries beside it are told "in progress"
//     (finished-bursts; the checker's finished-never-in-progress);
//   - trust-lease: every Claimer configured with lua.Options.TrustLease of
//     a whole lease, so a confirmed Redis lease answers "in progress"
//     without a read of the record for as long as it lives: the side of a
//     split brain that kept a holder's lease and not its completion tells
//     retries of finished work "in progress" (split-brain; the checker's
//     finished-never-in-progress).
//
// Three more break the settlement engine every entry point shares rather
// than the store, for the whole process while a scenario runs; each is
// caught by every entry-point scenario. The engine can be broken only in a
// binary built with -tags oncekey_negative (go run -tags oncekey_negative
// ./chaos/cmd/chaos, go test -tags oncekey_negative); without it
// [NegativeControl] returns [ErrNotBuilt] for them:
//
//   - one-attempt: the finishing write tried once, the lease stopped (a
//     short outage at completion lets a takeover run the work again);
//   - release-on-error: the key released for every outcome but a
//     completion (a panicked or uncertain operation runs again);
//   - no-recover: a panic neither recovered nor its renewals stopped (the
//     key held for as long as the process lives).
//
// The checker must report violations; the suite's tests require it. The
// broken store lives in an internal package: only the suite can build it.
//
// # Clocks
//
// The library reads no worker clock for any lease decision: leases expire
// by the database's clock and Redis's TTLs, and a worker measures its own
// deadline on the monotonic clock. The only clock it accepts is the Redis
// breaker's (the internal fastpath.Hooks.Now); the clock-skew scenario gives
// every worker's breaker a clock hours off and jumping, and simulates a Redis clock jump by its
// effect (PEXPIRE lease 1). Nothing may change, and the checker verifies
// that nothing did; the scenario also watches every claim and renewal and
// reports a takeover that returned before the lease it took over could
// have run out by the database's clock.
//
// # Isolation
//
// A run creates a PostgreSQL schema of its own (dropped at the end unless
// Config.KeepSchema) and uses a Redis key prefix of its own (deleted at the
// end). Scenarios that restart, fail over, split or evict Redis start
// redis-server processes of their own on loopback ports; with
// Config.Servers set (the runner's -containers), the servers of
// redis-restart, redis-sentinel, pg-crash and pg-failover-sync (and of the
// hazards pg-crash-async-commit and pg-failover-async) come from it
// instead (containers).
package chaos
