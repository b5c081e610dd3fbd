// Package postgres is the PostgreSQL backend of the durable store, on a pgx
// v5 pool: the production source of truth of oncekey. It implements
// [durable.Store] with pgx.Tx as the transaction type, so a claim, the
// caller's business write and the completion can commit in the caller's own
// transaction.
//
//	cfg, _ := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
//	_ = postgres.ConfigurePool(cfg)        // lock_timeout, idle_in_transaction_session_timeout
//	pool, _ := pgxpool.NewWithConfig(ctx, cfg)
//	store, _ := postgres.New(pool, postgres.WithKeySecret(secret))
//	_ = store.Migrate(ctx)                 // at start-up, from every instance
//
// # Schema
//
// One row per (tenant_id, operation, key_hash) in table idempotency_requests
// ([WithTable], [WithSchema]), created by [Store.Migrate] from the embedded
// file migration/001_create_idempotency_requests.up.sql (see [Migrations]).
// The client's key is never written: only its SHA-256, or HMAC-SHA-256 under
// [WithKeySecret], as [durable.Scope.Ref] computes it.
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
//   - [Store.InTx] sets both with SET LOCAL in its BEGIN (one round trip).
//   - A transaction the caller began runs with its session's settings: begin
//     it on a configured pool, or with [Store.InTx].
//
// # Errors
//
// Errors are translated at the boundary: pgx.ErrNoRows to
// [durable.ErrNotFound]; a closed pool, a refused or lost connection, a
// timeout, a cancelled context, lock_timeout, a serialization failure or a
// deadlock to [durable.ErrUnavailable], wrapping the cause so that both are
// visible with errors.Is and errors.As. Nothing half-written is left: every
// operation is one statement or one transaction.
//
// # Ambiguity
//
// A write whose connection is lost after it was sent may have applied. The
// store does not guess: on the pool it re-reads the record. A fenced write
// found in effect under the caller's token (completed with the same result,
// for example) is a success; a record still held by the token and not
// finished means the write did not apply ([durable.ErrUnavailable], retry);
// anything else is [durable.ErrFenced]. A repeated Complete with the same
// token and result succeeds for the same reason. In a transaction the
// outcome is decided by COMMIT: [Store.InTx] returns a failed COMMIT wrapped
// in [durable.ErrUnavailable], and the caller re-reads with [Store.Get].
//
// # Retention
//
// [Store.Sweep] deletes finished and released records past expires_at in
// bounded batches with FOR UPDATE SKIP LOCKED; processing and uncertain
// records are never deleted, and [Store.Stats] counts them. A claim of a
// finished record past its retention starts a new operation above the old
// generation; once Sweep deleted a record, its generations start again from
// the proposal: the guarantee ended with the retention.
package postgres
