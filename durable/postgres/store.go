package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/headers"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/driver/txmark"
	"github.com/oncekey/oncekey/fence"
)

var _ storeapi.Store[pgx.Tx] = (*store)(nil)

// store is the PostgreSQL implementation of [durable.Store], on a pgx v5
// pool that belongs to the caller. It is safe for concurrent use.
type store struct {
	txmark.Mark[pgx.Tx] // a durable.Store[pgx.Tx]
	pool                *pgxpool.Pool
	cfg                 config
	q                   queries
	lockMs              string
	// sessionOK: the pool's sessions carry lock_timeout (ConfigurePool or
	// the connection string), so statements need no per-statement bound.
	// Cleared when a session of the pool turns out not to have it (a
	// pooler dropped the startup parameter; see noteSession).
	sessionOK atomic.Bool
	beginSQL  string
	// table is the table's name as statements write it (schema-qualified
	// when a schema is set).
	table string
}

// New returns a [durable.Store] on pool, with pgx.Tx as its transaction
// type; it is safe for concurrent use. It does not touch the database; call
// [Migrate] once (at start-up, from any number of instances) to create
// the table.
//
// When the pool's runtime parameters include lock_timeout (see
// [ConfigurePool]), the store relies on them. Otherwise every statement the
// store sends on the pool that may wait for a row lock carries its own
// lock_timeout (set_config(..., true) in the same round trip, scoped to that
// statement's implicit transaction), and its InTx sets both timeouts at
// BEGIN. It returns an error wrapping [ErrConfig] for a nil pool or an
// invalid option. Behind PgBouncer in transaction mode, see the package
// documentation ("PgBouncer") for the pool it needs; [CheckDurability]
// refuses one that cannot work there.
func New(pool *pgxpool.Pool, opts ...Option) (durable.Store[pgx.Tx], error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: New: nil pool", ErrConfig)
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	table := c.table
	if c.schema != "" {
		table = c.schema + "." + c.table
	}
	_, sessionOK := pool.Config().ConnConfig.RuntimeParams[paramLockTimeout]
	s := &store{
		pool:   pool,
		cfg:    c,
		q:      buildQueries(table, c.table),
		table:  table,
		lockMs: millis(c.lockTimeout),
		beginSQL: "begin isolation level read committed; set local lock_timeout = " + millis(c.lockTimeout) +
			"; set local idle_in_transaction_session_timeout = " + millis(c.idleInTx),
	}
	s.sessionOK.Store(sessionOK)
	return s, nil
}

// Ref returns the stored identity of sc: its key hashed with SHA-256, or
// HMAC-SHA-256 under the [WithKeySecret] secret. It returns an error
// matching [durable.ErrInvalidScope] for an invalid scope.
func (s *store) Ref(sc durable.Scope) (durable.Ref, error) {
	if err := sc.Validate(); err != nil {
		return durable.Ref{}, fmt.Errorf("durable/postgres: ref: %w", err)
	}
	return sc.Ref(s.cfg.secret), nil
}

// querier is what both *pgxpool.Pool and pgx.Tx offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// on returns what a write runs on: tx, or the pool when tx is nil (the
// zero pgx.Tx: the write on its own).
func (s *store) on(tx pgx.Tx) querier {
	if tx == nil {
		return s.pool
	}
	return tx
}

// onPool reports whether q is the store's pool (not a transaction).
func (s *store) onPool(q querier) bool {
	p, ok := q.(*pgxpool.Pool)
	return ok && p == s.pool
}

// bounded reports whether a statement on q must carry its own lock_timeout:
// only on the pool, and only when its sessions do not.
func (s *store) bounded(q querier) bool { return !s.sessionOK.Load() && s.onPool(q) }

// queryRow runs a one-row statement that may wait for a row lock.
func (s *store) queryRow(ctx context.Context, q querier, sql string, args []any, dest ...any) error {
	if !s.bounded(q) {
		return q.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	b := &pgx.Batch{}
	b.Queue(setLockTimeoutSQL, s.lockMs)
	b.Queue(sql, args...)
	br := q.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// exec runs a write that may wait for a row lock and returns the rows it
// affected.
func (s *store) exec(ctx context.Context, q querier, sql string, args []any) (int64, error) {
	if !s.bounded(q) {
		tag, err := q.Exec(ctx, sql, args...)
		return tag.RowsAffected(), err
	}
	b := &pgx.Batch{}
	b.Queue(setLockTimeoutSQL, s.lockMs)
	b.Queue(sql, args...)
	br := q.SendBatch(ctx, b)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag.RowsAffected(), err
}

// keyArgs are the first four arguments of every statement that names one
// record by its key (getSQL, fenceWhere, adoptSQL): the scope's columns and
// the operation digest. The digest is the primary key once migration 007
// (a contract step) is applied; the scope's columns are the key before it,
// and what a partitioned table is partitioned by.
func keyArgs(ref durable.Ref) []any {
	h, d := ref.KeyHash, ref.Digest()
	return []any{ref.Tenant, ref.Operation, h[:], d[:]}
}

func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// rawRecord receives a record's columns (recCols), all nullable because the
// claim statement returns them from an outer join. The pgtype value types
// take a NULL without a pointer, so a row is scanned without an allocation
// per column.
type rawRecord struct {
	tenant, operation pgtype.Text
	keyHash           []byte
	fingerprint       pgtype.Text
	state             pgtype.Text
	generation        pgtype.Int8
	owner             pgtype.UUID
	leaseUs           pgtype.Int8
	status            pgtype.Int4
	headers           []byte // jsonb: the lossy copy, read only without headersBin
	headersBin, body  []byte
	version           pgtype.Int4
	resourceID        pgtype.Text
	takeovers         pgtype.Int4
	created           pgtype.Timestamptz
	completed         pgtype.Timestamptz
	expires           pgtype.Timestamptz
	expiresUs         pgtype.Int8
}

func (r *rawRecord) targets() []any {
	return []any{&r.tenant, &r.operation, &r.keyHash, &r.fingerprint, &r.state, &r.generation, &r.owner,
		&r.leaseUs, &r.status, &r.headers, &r.headersBin, &r.body, &r.version, &r.resourceID, &r.takeovers,
		&r.created, &r.completed, &r.expires, &r.expiresUs}
}

func (r *rawRecord) valid() bool { return r.tenant.Valid }

func (r *rawRecord) record() (durable.Record, error) {
	var rec durable.Record
	rec.Ref.Tenant, rec.Ref.Operation = r.tenant.String, r.operation.String
	if len(r.keyHash) != len(rec.Ref.KeyHash) {
		return rec, fmt.Errorf("durable/postgres: corrupt record: key hash of %d bytes", len(r.keyHash))
	}
	copy(rec.Ref.KeyHash[:], r.keyHash)
	rec.Fingerprint = r.fingerprint.String
	rec.State = durable.State(r.state.String)
	if !storeapi.ValidState(rec.State) {
		return rec, fmt.Errorf("durable/postgres: corrupt record: state %q", rec.State)
	}
	rec.Token.Generation = uint64(r.generation.Int64)
	if r.owner.Valid {
		rec.Token.Owner = r.owner.Bytes
	}
	rec.Released = rec.State == durable.Processing && !r.owner.Valid
	rec.LeaseRemaining = time.Duration(r.leaseUs.Int64) * time.Microsecond
	if rec.State.Finished() {
		res := &durable.Result{
			StatusCode: int(r.status.Int32),
			Body:       r.body,
			Version:    int(r.version.Int32),
			ResourceID: r.resourceID.String,
		}
		if res.Body == nil {
			res.Body = []byte{}
		}
		switch {
		case r.headersBin != nil:
			h, err := headers.Decode(r.headersBin)
			if err != nil {
				return rec, fmt.Errorf("durable/postgres: corrupt record: headers: %w", err)
			}
			res.Headers = h
		case r.headers != nil:
			// Finished by an instance of the version before migration 002.
			if err := json.Unmarshal(r.headers, &res.Headers); err != nil {
				return rec, fmt.Errorf("durable/postgres: corrupt record: headers: %w", err)
			}
		}
		rec.Result = res
	}
	rec.Takeovers = int(r.takeovers.Int32)
	rec.CreatedAt = r.created.Time
	rec.CompletedAt = r.completed.Time
	rec.ExpiresAt = r.expires.Time
	rec.ExpiresIn = time.Duration(r.expiresUs.Int64) * time.Microsecond
	return rec, nil
}

// Get reads the record of ref, with LeaseRemaining and ExpiresIn measured
// by the database's clock. It returns an error matching
// [durable.ErrNotFound] when there is none and [durable.ErrUnavailable]
// when the database cannot be reached.
func (s *store) Get(ctx context.Context, ref durable.Ref) (durable.Record, error) {
	return s.get(ctx, s.pool, ref)
}

func (s *store) get(ctx context.Context, q querier, ref durable.Ref) (durable.Record, error) {
	var raw rawRecord
	if err := q.QueryRow(ctx, s.q.get, keyArgs(ref)...).Scan(raw.targets()...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return durable.Record{}, errGetNotFound // the common answer before a fresh Do: not built per call
		}
		return durable.Record{}, translate("get", err)
	}
	return raw.record()
}

// errGetNotFound is translate("get", pgx.ErrNoRows).
var errGetNotFound = fmt.Errorf("durable/postgres: get: %w", durable.ErrNotFound)

// Operation reads the record whose operation identity has digest, within
// tenant: one read by the operation index (on a table WithPartitions, one
// index read in each partition: the digest is not in the partition key).
// Another tenant's record, like an unknown digest, returns an error matching
// [durable.ErrNotFound].
func (s *store) Operation(ctx context.Context, tenant string, digest [32]byte) (durable.Record, error) {
	var raw rawRecord
	if err := s.pool.QueryRow(ctx, s.q.operation, digest[:], tenant).Scan(raw.targets()...); err != nil {
		return durable.Record{}, translate("operation", err)
	}
	return raw.record()
}

// Handover hands the processing record held by from to owner under
// generation from+1 and a lease of lease, in one statement: exactly one
// handover of a token succeeds; [durable.ErrFenced] when the record is not
// held by from (handed over, taken over, finished, released, gone), and
// [durable.ErrUnavailable] when the reply was lost.
func (s *store) Handover(ctx context.Context, ref durable.Ref, from fence.Token, owner uuid.UUID, lease time.Duration) (fence.Token, error) {
	switch {
	case owner == uuid.Nil:
		return fence.Token{}, fmt.Errorf("durable/postgres: handover: %w", storeapi.Invalid("owner", "nil UUID"))
	case lease < time.Millisecond:
		return fence.Token{}, fmt.Errorf("durable/postgres: handover: %w", storeapi.Invalid("lease", "shorter than 1ms"))
	}
	var gen int64
	err := s.queryRow(ctx, s.pool, s.q.handover, fenceArgs(ref, from, pgUUID(owner), lease.Microseconds()), &gen)
	if errors.Is(err, pgx.ErrNoRows) {
		return fence.Token{}, fmt.Errorf("durable/postgres: handover: %w", durable.ErrFenced)
	}
	if err != nil {
		return fence.Token{}, translate("handover", err)
	}
	return fence.Token{Generation: uint64(gen), Owner: owner}, nil
}

// Pending lists, oldest first, at most limit records for the reconciler:
// processing records whose lease expired at least staleFor ago and
// uncertain records whose lease is free. Released records are not listed.
// It returns [durable.ErrInvalidScope] for a limit below 1 or a negative
// staleFor, and [durable.ErrUnavailable] when the database cannot be reached.
func (s *store) Pending(ctx context.Context, staleFor time.Duration, limit int) ([]durable.Record, error) {
	switch {
	case limit < 1 || limit > math.MaxInt32:
		return nil, fmt.Errorf("durable/postgres: pending: %w", storeapi.Invalid("limit", "must be at least 1"))
	case staleFor < 0:
		return nil, fmt.Errorf("durable/postgres: pending: %w", storeapi.Invalid("stale_for", "negative"))
	}
	rows, err := s.pool.Query(ctx, s.q.pending, staleFor.Microseconds(), limit)
	if err != nil {
		return nil, translate("pending", err)
	}
	defer rows.Close()
	var out []durable.Record
	for rows.Next() {
		var raw rawRecord
		if err := rows.Scan(raw.targets()...); err != nil {
			return nil, translate("pending", err)
		}
		rec, err := raw.record()
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, translate("pending", err)
	}
	return out, nil
}

// Sweep deletes at most batch finished (completed, failed) or released
// records past their retention, oldest expiry first, and returns how many
// it deleted. A record whose generation is not below the database's clock in
// milliseconds minus 120000 (one created or restarted in about the last
// minute) stays until the clock passes it, so that generations rise across
// the sweep (see the package documentation). Rows locked by a concurrent claim are skipped (FOR UPDATE SKIP
// LOCKED), so a sweep never blocks a claim. Processing and uncertain
// records are never deleted; Stats counts them. Call it in a loop
// until it returns less than batch. batch below 1 returns an error matching
// [durable.ErrInvalidScope]; an unreachable database [durable.ErrUnavailable].
func (s *store) Sweep(ctx context.Context, batch int) (int, error) {
	if batch < 1 || batch > math.MaxInt32 {
		return 0, fmt.Errorf("durable/postgres: sweep: %w", storeapi.Invalid("batch", "must be at least 1"))
	}
	var n int64
	if err := s.pool.QueryRow(ctx, s.q.sweep, batch).Scan(&n); err != nil {
		return 0, translate("sweep", err)
	}
	return int(n), nil
}

// statsExactMaxPages is the size (8 KiB pages, all partitions together) up
// to which Stats counts every record exactly with a sequential scan: 1 MiB,
// a few thousand records, read in about a millisecond. Above it Stats
// estimates the completed and failed totals instead. A variable so that
// tests can take either path on any table.
var statsExactMaxPages int64 = 128

// Stats summarizes the table at a cost that does not grow with it, and reads
// the durability settings as [CheckDurability] does into Durability. It
// returns [durable.ErrUnavailable] when the database cannot be reached.
//
// One statement reads partial indexes only (pending_idx, sweep_idx and
// takeovers_idx; see the migrations): the processing, uncertain and released
// counts, StaleProcessing, ExpiredUnswept, ExpiredStuck and Takeovers are
// exact, and cost what those small sets hold (ExpiredUnswept: the sweep
// backlog). ByState[Completed] and ByState[Failed] are estimates from the
// planner's statistics: each table's (or partition's) row density at its
// last VACUUM or ANALYZE, times its current size, times the share of that
// state in ANALYZE's sample. They follow the table within autovacuum's
// thresholds (10 % changed rows by default) and are 0 until the table is
// first analyzed. OldestUnexpiredAge is exact for processing and uncertain
// records; for finished and released ones it is the age of the one whose
// retention ends first, which is the oldest when they share one retention.
//
// While the table is at most statsExactMaxPages (1 MiB) in size, a second
// statement counts everything exactly in one sequential scan of it instead
// (so a small table, a test's above all, gets exact numbers).
func (s *store) Stats(ctx context.Context) (durable.Stats, error) {
	var leased, unc, released, stale, stuck, oldestUs, unswept, takeovers, done, failed, pages int64
	err := s.pool.QueryRow(ctx, s.q.stats).Scan(&leased, &unc, &released, &stale, &stuck, &oldestUs,
		&unswept, &takeovers, &done, &failed, &pages)
	if err != nil {
		return durable.Stats{}, translate("stats", err)
	}
	if pages <= statsExactMaxPages {
		err := s.pool.QueryRow(ctx, s.q.statsExact).Scan(&leased, &done, &failed, &unc, &released, &oldestUs,
			&stale, &unswept, &stuck, &takeovers)
		if err != nil {
			return durable.Stats{}, translate("stats", err)
		}
	}
	dur, err := s.Durability(ctx)
	if err != nil {
		return durable.Stats{}, err
	}
	return durable.Stats{
		Durability: dur,
		ByState: map[durable.State]int64{
			durable.Processing: leased, durable.Completed: done, durable.Failed: failed, durable.Uncertain: unc,
		},
		Released:           released,
		OldestUnexpiredAge: time.Duration(oldestUs) * time.Microsecond,
		StaleProcessing:    stale,
		ExpiredUnswept:     unswept,
		ExpiredStuck:       stuck,
		Takeovers:          takeovers,
	}, nil
}

// InTx runs fn in a new READ COMMITTED transaction whose lock_timeout and
// idle_in_transaction_session_timeout are the store's (SET LOCAL, sent with
// BEGIN in one round trip). It commits when fn returns nil, and rolls back
// when fn returns an error (returned as it is) or panics (the panic goes
// on). A failed BEGIN is translated like any statement. A failed COMMIT is
// told apart:
//
//   - refused by the server (an ERROR such as a deferred constraint
//     violation or a serialization failure, or a transaction that had
//     already failed): nothing was committed. The error is returned
//     wrapping the *pgconn.PgError (or pgx.ErrTxCommitRollback), not
//     [durable.ErrUnavailable], so the caller does not wait for an outcome
//     that is known.
//   - its reply lost or missing (a network error, a timeout, a closed
//     connection, a FATAL answer): the outcome is unknown, since the server
//     may have committed. It is returned wrapped in [durable.ErrUnavailable]:
//     re-read with Get to learn it.
//
// READ COMMITTED is what makes a concurrent claimer wait on the row and then
// see the committed outcome; under REPEATABLE READ it would fail instead.
func (s *store) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: s.beginSQL})
	if err != nil {
		return translate("begin", err)
	}
	done := false
	defer func() {
		if done {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // a lost connection rolls back on the server too
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	done = true
	if err := tx.Commit(ctx); err != nil {
		if commitRefused(err) {
			return fmt.Errorf("durable/postgres: commit refused, transaction rolled back: %w", err)
		}
		return unavailable("commit (outcome unknown: re-read)", err)
	}
	return nil
}

// commitRefused reports whether a failed COMMIT definitely did not commit:
// the server answered it with an ERROR (a deferred constraint violated, a
// serialization failure: the transaction rolled back), or with ROLLBACK (an
// earlier statement had failed). A lost or missing reply (a network error, a
// timeout, a closed connection) is ambiguous, and so is a FATAL or PANIC
// answer: a backend ended while waiting for synchronous replication, for
// one, reports FATAL after it committed locally.
func commitRefused(err error) bool {
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	severity := pgErr.SeverityUnlocalized
	if severity == "" {
		severity = pgErr.Severity
	}
	return severity == "ERROR"
}

// encodeResult returns the stored forms of res: its headers byte for byte
// (bin, nil when there are none), their lossy jsonb copy (jsonHeaders, for an
// instance of the previous version; nil when there are none), and its body
// (never nil). jsonHeaders is JSON text, not bytes: in the query exec modes
// without a statement description (exec, simple_protocol, which a pool
// behind PgBouncer in transaction mode uses) pgx encodes a []byte as bytea,
// which is not JSON.
func encodeResult(res durable.Result) (bin []byte, jsonHeaders *string, body []byte, err error) {
	if res.StatusCode < math.MinInt32 || res.StatusCode > math.MaxInt32 {
		return nil, nil, nil, storeapi.Invalid("status_code", "out of range")
	}
	if res.Version < math.MinInt32 || res.Version > math.MaxInt32 {
		return nil, nil, nil, storeapi.Invalid("version", "out of range")
	}
	if len(res.Headers) > 0 {
		j, err := json.Marshal(res.Headers)
		if err != nil {
			return nil, nil, nil, storeapi.Invalid("headers", err.Error())
		}
		js := string(j)
		jsonHeaders = &js
	}
	body = res.Body
	if body == nil {
		body = []byte{}
	}
	return headers.Encode(res.Headers), jsonHeaders, body, nil
}

// sameResult reports whether a stored result is the one a caller completes
// with again (nil and empty headers, values and bodies are alike). Headers
// are compared in their stored, byte-for-byte encoding.
func sameResult(stored *durable.Result, res durable.Result) bool {
	if stored == nil {
		return false
	}
	return stored.StatusCode == res.StatusCode && stored.Version == res.Version &&
		stored.ResourceID == res.ResourceID && bytes.Equal(stored.Body, res.Body) &&
		bytes.Equal(headers.Encode(stored.Headers), headers.Encode(res.Headers))
}

func fencedErr(op string) error { return fmt.Errorf("durable/postgres: %s: %w", op, durable.ErrFenced) }

// errMismatch is the claim's ErrMismatch.
func errMismatch() error { return fmt.Errorf("durable/postgres: claim: %w", durable.ErrMismatch) }

// errConflictLoop answers a claim whose record kept changing under it: the
// store could not serve it now.
var errConflictLoop = fmt.Errorf("durable/postgres: claim: %w: the record kept changing under the claim", durable.ErrUnavailable)
