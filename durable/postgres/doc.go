// Package postgres is the PostgreSQL backend of the durable store, on a pgx
// v5 pool: the production source of truth of oncekey. It implements
// [durable.Store] with pgx.Tx as the transaction type, so a claim, the
// caller's business write and the completion can commit in the caller's own
// transaction.
//
//	cfg, _ := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
//	_ = postgres.ConfigurePool(cfg)        // lock_timeout, idle_in_transaction_session_timeout
//	pool, _ := pgxpool.NewWithConfig(ctx, cfg)
//	_ = postgres.Migrate(ctx, pool)        // at start-up, from every instance
//	store, _ := postgres.New(pool, postgres.WithKeySecret(secret))
//
// # Schema
//
// One row per (tenant_id, operation, key_hash) in table idempotency_requests
// ([WithTable], [WithSchema]), created by [Migrate] from the embedded
// files migration/001_create_idempotency_requests.up.sql and
// 002_retention_and_binary_headers.up.sql (see [Migrations]). 002 adds
// retention_us (the retention each claim stores, so that a late finish keeps
// a full retention) and response_headers_bin (headers byte for byte; the
// jsonb column is still written as a lossy copy for the previous version and
// read only for rows without the new one), and converts existing rows once.
// Both are nullable, so instances of the previous version keep working
// during a rolling deploy; 002's down file drops them.
// The client's key is never written: only its SHA-256, or HMAC-SHA-256 under
// [WithKeySecret], as [durable.Scope.Ref] computes it.
//
// 003 adds operation_digest (the operation identity, read by its own
// index) and 004 a partial index on the records ever taken over, for
// [durable.Store.Stats].
//
// # The digest as the key (006, 007)
//
// 006 gives every row its digest and makes sure the primary key
// constraint is named <table>_pkey. From 006 on, the store names a record
// by its digest and its scope's columns in every statement, and its claim
// upserts ON CONFLICT ON CONSTRAINT <table>_pkey, whatever that key's
// columns. 007 is a contract step: Migrate never runs it; the operator runs
// "oncekey migrate contract -yes" (or the file
// 007_digest_primary_key.contract.sql, in one transaction) once every
// instance runs a version with 006. It makes operation_digest the primary
// key and drops the (tenant_id, operation, key_hash) key's index and 003's
// operation index: every write maintains one B-tree fewer, and a narrower
// one (measured in bench/README.md). An instance of a version before 006
// claims ON CONFLICT (tenant_id, operation, key_hash), which fails once
// 007 is applied; 007's down file puts the old key back. 007 reads the
// table twice while writes wait (NOT NULL, the index build): run it at a
// quiet time. It refuses a partitioned table, which keeps the old key.
//
// [Migrate] records each applied version in the table <table>_migrations
// beside it; the operator CLI (cmd/oncekey: migrate status, migrate
// contract, migrate down) reports them, applies contract steps and rolls
// back one step with the .down.sql files.
//
// # Partitions
//
// With [WithPartitions](n), [Migrate] creates the table PARTITION BY HASH
// (tenant_id, operation, key_hash), its primary key, with n partitions
// <table>_p0 ... <table>_p<n-1>; n is fixed when the table is created (a
// table that exists with another partitioning is refused with a
// an error matching [ErrConfig] that names both). The primary key, and so the uniqueness the
// claim relies on, is unchanged: a key hashes to one partition, whose
// primary key index arbitrates the INSERT ... ON CONFLICT. Every statement
// for one record (the claim and its replay read, Get, Renew, Handover,
// Complete, Fail, MarkUncertain, Release, Adopt) names the full key (and
// the digest), so the
// planner prunes it to one partition for the arguments it is sent with
// (PostgreSQL keeps planning these statements for their arguments: a generic
// plan costs more). The read by operation identity (the claim package's
// operation lookup) is not pruned: operation_digest is not in the partition
// key (it is derived from it), so it probes the operation index of every
// partition, n index reads.
// Pending, Sweep and Stats read every partition, each by its partial index.
//
// What it costs: planning each statement for its arguments, with partition
// pruning, costs CPU on every call where an unpartitioned table reuses a
// cached plan; on this project's 2-core test machine fresh claim → complete
// ran at 0.47 of the unpartitioned throughput with 16 partitions
// (BenchmarkPartitions). Sessions set to plan_cache_mode=force_generic_plan
// ran at 0.79: a generic plan is pruned when it starts, so it still reads
// one partition, but it locks every partition and its indexes at each
// execution. Partition for what it buys on a very large table (smaller
// indexes, per-partition VACUUM), not for throughput.
//
// # Stats
//
// [durable.Store.Stats] reads partial indexes only, so its cost follows the
// small sets it counts (processing, uncertain, released, the sweep backlog,
// the records taken over), not the table; it estimates the completed and
// failed totals on a table above 1 MiB. See [durable.Stats].
//
// # One statement per operation
//
// A claim is one INSERT ... ON CONFLICT (tenant_id, operation, key_hash) DO
// UPDATE ... WHERE <takeover allowed> RETURNING, wrapped in a statement that
// also returns the existing record when nothing was written: never
// check-then-insert. Complete, Fail, MarkUncertain, Renew and Release are
// each one UPDATE matching owner_token AND generation AND the expected
// state. So Claim and Complete on the pool take two round trips; in the
// caller's transaction they are one transaction (BEGIN, claim, complete,
// COMMIT). Every lease and retention time is computed in SQL from
// clock_timestamp(), never now() (frozen at the start of a transaction) and
// never a worker's clock.
//
// # Timeouts
//
// A worker paused inside an open transaction holds its row lock. Two server
// settings bound the harm, and the store applies them without an extra
// round trip:
//
//   - lock_timeout: a statement waiting longer than this for a row lock
//     fails (SQLSTATE 55P03), reported as [durable.ErrUnavailable]
//     (retryable; nothing was written).
//   - idle_in_transaction_session_timeout: a session idle that long inside a
//     transaction is ended by the server, which rolls the transaction back
//     and frees its locks; a new owner can then claim.
//
// Where they apply:
//
//   - [ConfigurePool] sets both as runtime parameters of every session of
//     the pool (the recommended setup; they travel in the startup message).
//     [New] sees lock_timeout in the pool's configuration and sends each
//     statement as it is.
//   - Without it, every statement the store sends on the pool that can
//     wait for a row lock (Claim and the fenced writes) is sent in the same
//     round trip as set_config('lock_timeout', ..., true), which holds for
//     that statement's implicit transaction only.
//   - The store's own transactions (the one claim.Claimer.Do runs in) set
//     both with SET LOCAL in their BEGIN (one round trip).
//   - A transaction the caller began runs with its session's settings: begin
//     it on a configured pool. A claim.Claimer (with a logger) warns once
//     when the pool's sessions have neither timeout.
//   - Behind PgBouncer in transaction mode ConfigurePool cannot work (see
//     "PgBouncer"): set both per role or database instead.
//
// # PgBouncer
//
// The store works behind PgBouncer in transaction pooling mode (tested
// with 1.18: the contract suite and the claim flows run through it), where
// each transaction, and each statement outside one, may run on another
// server session. Nothing of the store depends on a session outliving a
// transaction: a claim or a fenced write is one statement, its own
// lock_timeout travels in the same implicit transaction
// (set_config(..., true)), the store's transactions set both timeouts with
// SET LOCAL, and [Migrate] holds a transaction-scoped advisory lock
// (pg_advisory_xact_lock) in its one transaction, so it runs through the
// pooler as well as on a direct connection. What the pool must be:
//
//   - a query exec mode without named prepared statements, set before
//     pgxpool.NewWithConfig: cfg.ConnConfig.DefaultQueryExecMode =
//     pgx.QueryExecModeExec (or default_query_exec_mode=exec in the
//     connection string); QueryExecModeCacheDescribe, DescribeExec and
//     SimpleProtocol work too. pgx's default, cache_statement, prepares
//     named statements that stay on the server session, not the client:
//     another client then fails with "prepared statement ... already
//     exists" (42P05) or "does not exist" (26000). PgBouncer 1.21 or later
//     with max_prepared_statements, or pool_mode = session, keeps them.
//   - no startup parameters: do not call [ConfigurePool], and put no
//     search_path, lock_timeout or options in the connection string.
//     PgBouncer refuses a parameter it does not know (the connection fails),
//     or, listed in ignore_startup_parameters, drops it. Name the schema
//     with [WithSchema]; set lock_timeout and
//     idle_in_transaction_session_timeout per role or database (ALTER ROLE
//     ... SET, ALTER DATABASE ... SET), so that every server session has
//     them, transactions the caller begins included (DoTx, claimriver): the
//     store bounds its own statements and transactions either way.
//   - durability settings on the server side: synchronous_commit and the
//     others are read from the server session that serves the statement,
//     so set them in postgresql.conf, per role or database, or in
//     PgBouncer's connect_query, never with a session-level SET through
//     the pooler (it stays on whichever server session ran it).
//
// So, through PgBouncer:
//
//	cfg, _ := pgxpool.ParseConfig(os.Getenv("PGBOUNCER_URL")) // no parameters
//	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
//	pool, _ := pgxpool.NewWithConfig(ctx, cfg)
//	_ = postgres.Migrate(ctx, pool, postgres.WithSchema("app"))
//	if err := postgres.CheckDurability(ctx, pool); err != nil { /* refuse to start */ }
//	store, _ := postgres.New(pool, postgres.WithSchema("app"), postgres.WithKeySecret(secret))
//
// The store refuses what cannot work, rather than running without a
// guarantee: [CheckDurability] (call it at start-up) returns an error
// matching [ErrConfig], naming PgBouncer and the fix, for named prepared
// statements that do not stay with the client (it recognizes a pooler by
// the backend pid it shows, which is not its server session's, and then
// tries a named statement from a second connection) and for ConfigurePool's
// timeouts refused or dropped by the pooler. Every operation translates the
// same failures (42P05 or 26000 on a statement pgx named, a startup
// parameter refused) to an error matching [ErrConfig], not
// [durable.ErrUnavailable]: retrying does not help. When the timeouts the
// pool sends as startup parameters are not in its sessions, the store also
// stops relying on them once it has read a session (Stats, or a
// claim.Claimer's settings read) and bounds its own statements again.
//
// # Errors
//
// Errors are translated at the boundary: pgx.ErrNoRows to
// [durable.ErrNotFound]; a closed pool, a refused or lost connection, a
// timeout, a cancelled context, lock_timeout, a serialization failure or a
// deadlock to [durable.ErrUnavailable], wrapping the cause so that both are
// visible with errors.Is and errors.As; a table (or its schema, or a column)
// that is not there to [ErrNotMigrated], which says to run `oncekey migrate
// up` or [Migrate]. Nothing half-written is left: every operation is one
// statement or one transaction.
//
// # Ambiguity
//
// A write whose connection is lost after it was sent may have applied. The
// store does not guess: on the pool it re-reads the record, on a context
// detached from the caller's and bounded to 5 s (a client that went away,
// cancelling ctx, is the usual reason the reply was lost; the claim it made
// must still be resolved, not left to block the key for a lease). Then:
//
//   - a fenced write found in effect under the caller's token (completed
//     with the same result, for example) is a success; a repeated Complete
//     with the same token and result succeeds for the same reason;
//   - a record that proves the write did not apply (still held by the
//     token and unfinished: [durable.ErrUnavailable], retry; a token the
//     record never had, or a final state the write cannot have led to:
//     [durable.ErrFenced]);
//   - anything else (a newer owner, the record gone) may follow the write
//     having applied (a Release then a new claim, a MarkUncertain then an
//     adoption): the outcome is unknown, [durable.ErrUnavailable] with a
//     message that says so. [durable.ErrFenced] always means "did not
//     apply".
//
// In a transaction the outcome is decided by COMMIT. The store tells a
// COMMIT the server refused (an ERROR: a deferred constraint, a
// serialization failure; or ROLLBACK for a transaction that had failed),
// which committed nothing and is returned as that error, from one whose
// reply was lost or that was answered FATAL, which may have committed and is
// returned wrapped in [durable.ErrUnavailable]: the caller re-reads with
// [durable.Store.Get].
//
// # Retention
//
// expires_at is created_at + the claim's retention; Complete and Fail raise
// it to at least their clock_timestamp() + the retention, so a record
// finished late keeps a full retention; a takeover raises it to a full
// retention from the takeover. [durable.Store.Sweep] deletes finished and released
// records past expires_at in bounded batches with FOR UPDATE SKIP LOCKED;
// processing and uncertain records are never deleted, and [durable.Store.Stats]
// counts them. A claim of a finished record past its retention starts a new
// operation above the old generation.
//
// # Generations and the database's clock
//
// A created or restarted record gets a generation of at least the
// database's clock_timestamp() in whole milliseconds since the Unix epoch
// minus 60000, and Sweep deletes a record only once its generation is below
// that clock minus 120000, so a scope claimed again after its record was
// swept gets a higher generation than before (see the durable package
// documentation). lock_timeout bounds how long a claim can wait, far below
// the 60 s this leaves. The server's clock must not step back by more than
// about a minute.
package postgres
