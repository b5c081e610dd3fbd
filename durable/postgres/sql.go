package postgres

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
)

// The generation floor and the sweep margin, in milliseconds of the
// database's clock (clockMs below). Why they keep generations rising per
// scope across Sweep, and what they assume of the clock, is told once, in
// package durable's documentation (# Generations).
const (
	generationFloorLagMs    = 60_000
	sweepGenerationMarginMs = 120_000
)

// clockMs is the database's clock in whole milliseconds since the Unix epoch;
// %C is replaced by a timestamptz expression.
const clockMs = `floor(EXTRACT(EPOCH FROM %C) * 1000)::bigint`

// The statements of a store, with the table name filled in by New. Every
// time is taken from the database's clock (clock_timestamp(), which, unlike
// now(), moves inside a transaction); durations travel as microseconds.
type queries struct {
	claim, claimNew, get, operation, handover, complete, fail, markUncertain, renew, release, adopt string
	insertCompleted, insertFailed                                                                   string
	insertCompletedLocked, insertFailedLocked                                                       string
	pending, sweep, stats, statsExact                                                               string
	steps                                                                                           stepQueries
}

// recCols reads a record r relative to n.now, a clock_timestamp() taken once
// per statement. Scanned by scanRecord.
const recCols = `r.tenant_id, r.operation, r.key_hash, r.request_hash, r.state::text, r.generation, r.owner_token,
	COALESCE(GREATEST(0, (EXTRACT(EPOCH FROM (r.lease_expires_at - n.now)) * 1000000)::bigint), 0) AS lease_us,
	r.status_code, r.response_headers, r.response_headers_bin, r.response_body, r.response_version, r.resource_id, r.takeovers,
	r.created_at, r.completed_at, r.expires_at,
	(EXTRACT(EPOCH FROM (r.expires_at - n.now)) * 1000000)::bigint AS expires_us`

// claimSQL is the claim: one statement. $1 tenant, $2 operation, $3 key
// hash, $4 fingerprint, $5 proposed generation, $6 owner, $7 lease µs,
// $8 retention µs, $9 operation digest (durable.Ref.Digest).
//
//   - fin reads a finished record within its retention with the
//     statement's snapshot, without a lock. Such a record does not change
//     until it expires (only a restart past retention, or a sweep, touches
//     it then), so when fin finds one, ins inserts nothing, no row is
//     locked and nothing is written: a replay answered by the database is
//     one indexed read, not a locking upsert.
//   - ins inserts the record, or takes it over when the rule allows
//     (its conflict target is the primary key by its constraint's name,
//     which migration 006 makes sure of: (tenant_id, operation, key_hash)
//     until 007's contract step makes it the operation digest, and always
//     on a partitioned table; the statement is the same for both, and
//     every statement names the record by the digest and the scope's
//     columns, so either index finds it and a partitioned table prunes)
//     (EXCLUDED.created_at is the statement's clock). A takeover keeps
//     created_at, so "ins.created_at <> c.now" tells a takeover apart. Its
//     generation is GREATEST($5, stored+1) for a takeover of an expired
//     lease, and GREATEST($5, stored+1, the clock floor) for a fresh insert
//     or a restart (EXCLUDED.generation carries $5 and the floor). Its
//     retention_us is the claim's; a takeover keeps the longer of the two,
//     as it keeps the later expires_at.
//   - old tells a restart from a fresh insert (the statement's snapshot).
//   - cur returns the existing record when nothing was written. FOR SHARE
//     makes it the latest committed version (the one ON CONFLICT decided
//     on), not the snapshot's. When the conflicting row was committed after
//     the snapshot, cur is empty and the caller reads the row again.
//
// In every case the statement returns exactly one row.
const claimSQL = `WITH lk AS MATERIALIZED (SELECT ` + keyLockSQL + `),
c AS MATERIALIZED (SELECT clock_timestamp() AS now FROM lk),
fin AS MATERIALIZED (
	SELECT ` + recCols + `
	FROM %T r, c n
	WHERE r.operation_digest = $9::bytea AND r.tenant_id = $1::text AND r.operation = $2::text AND r.key_hash = $3::bytea
		AND r.state IN ('completed', 'failed') AND r.expires_at > n.now
),
ins AS (
	INSERT INTO %T AS t (tenant_id, operation, key_hash, request_hash, state, generation, owner_token,
		lease_expires_at, takeovers, created_at, expires_at, retention_us, operation_digest)
	SELECT $1::text, $2::text, $3::bytea, $4::text, 'processing',
		GREATEST($5::bigint, 1, %FLOOR), $6::uuid,
		(SELECT now FROM c) + $7::bigint * interval '1 microsecond', 0, (SELECT now FROM c),
		(SELECT now FROM c) + $8::bigint * interval '1 microsecond', $8::bigint, $9::bytea
	WHERE NOT EXISTS (SELECT 1 FROM fin)
	ON CONFLICT ON CONSTRAINT %PKEY DO UPDATE SET
		generation = CASE WHEN t.state = 'processing' AND t.owner_token IS NOT NULL
			THEN GREATEST($5::bigint, t.generation + 1) ELSE GREATEST(EXCLUDED.generation, t.generation + 1) END,
		retention_us = CASE WHEN t.state = 'processing' AND t.owner_token IS NOT NULL
			THEN GREATEST(t.retention_us, EXCLUDED.retention_us) ELSE EXCLUDED.retention_us END,
		owner_token = EXCLUDED.owner_token,
		lease_expires_at = EXCLUDED.lease_expires_at,
		takeovers = t.takeovers + CASE WHEN t.state = 'processing' AND t.owner_token IS NOT NULL THEN 1 ELSE 0 END,
		created_at = CASE WHEN t.state = 'processing' AND t.owner_token IS NOT NULL THEN t.created_at ELSE EXCLUDED.created_at END,
		expires_at = CASE WHEN t.state = 'processing' AND t.owner_token IS NOT NULL
			THEN GREATEST(t.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END,
		request_hash = EXCLUDED.request_hash,
		operation_digest = EXCLUDED.operation_digest,
		state = 'processing',
		status_code = NULL, response_headers = NULL, response_headers_bin = NULL, response_body = NULL,
		response_version = NULL, resource_id = NULL, completed_at = NULL
	WHERE (t.state = 'processing' AND t.owner_token IS NOT NULL AND t.lease_expires_at <= EXCLUDED.created_at
			AND t.request_hash = EXCLUDED.request_hash)
		OR (t.state = 'processing' AND t.owner_token IS NULL)
		OR (t.state IN ('completed', 'failed') AND t.expires_at <= EXCLUDED.created_at)
	RETURNING t.generation, t.created_at
),
old AS (SELECT 1 FROM %T WHERE operation_digest = $9 AND tenant_id = $1 AND operation = $2 AND key_hash = $3),
cur AS (
	SELECT ` + recCols + `
	FROM %T r, (SELECT clock_timestamp() AS now) n
	WHERE r.operation_digest = $9 AND r.tenant_id = $1 AND r.operation = $2 AND r.key_hash = $3
		AND NOT EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM fin)
	FOR SHARE OF r
),
rec AS (SELECT * FROM fin UNION ALL SELECT * FROM cur)
SELECT ins.generation, COALESCE(ins.created_at <> c.now, false), EXISTS (SELECT 1 FROM old), rec.*
FROM c LEFT JOIN ins ON true LEFT JOIN rec ON true`

// keyLockSQL takes the key's lock in a claim statement, before its clock
// reading: a transaction-scoped advisory lock of the two-int form, in the
// store's namespace (%NS, lockNamespace), on the first 32 bits of the
// operation digest $9. Every claim takes it, so a Do that holds it while
// its record does not exist yet (InsertAtCommit with LockFirst) orders the
// claims of its key after its COMMIT. Two keys whose digests share 32 bits
// share the lock: they wait on each other, nothing else. The insert's
// conflict detection does not depend on the statement's snapshot, so
// taking the lock inside the statement is enough here; Do's check, which
// is a read, runs in a statement after its lock (lockFirstSQL).
const keyLockSQL = `pg_advisory_xact_lock(%NS, ((get_byte($9::bytea, 0) << 24) | (get_byte($9::bytea, 1) << 16) | (get_byte($9::bytea, 2) << 8) | get_byte($9::bytea, 3)))`

// lockNamespace returns the first int of the key locks of the store whose
// table is table (as its statements name it): the first 32 bits of
// SHA-256("oncekey/lock/v1", 0, table). Advisory locks are the database's,
// not a schema's: two stores in one database (two schemas, two services)
// lock apart. Applications' advisory locks of the one-bigint form never
// meet these (the two forms are separate lock spaces); one of the two-int
// form would only if it chose the same pair of ints.
func lockNamespace(table string) int32 {
	h := sha256.Sum256([]byte("oncekey/lock/v1\x00" + table))
	return int32(binary.BigEndian.Uint32(h[:4]))
}

// claimNewSQL is the first statement of a claim: the insert of a record
// that does not exist, exactly as claimSQL's ins inserts one ($1-$9 as
// there), returning its generation; no row when the scope has a record
// (ON CONFLICT DO NOTHING takes no lock on it, after waiting for a
// transaction that inserts or holds it; naming no target, it arbitrates on
// the primary key whichever its columns). The claim then runs claimSQL.
//
// The store sends it only with ClaimParams.ExpectNew (Redis has just
// granted the key, so there is most likely no record): the insert alone
// costs the server about a third less than claimSQL (whose plan, a dozen
// subplans and an upsert, costs more to start than the insert costs to
// run), and a key that has a record after all costs one more round trip.
// docs/DESIGN.md (§5, step 3) has the measurement.
const claimNewSQL = `WITH lk AS MATERIALIZED (SELECT ` + keyLockSQL + `),
c AS MATERIALIZED (SELECT clock_timestamp() AS now FROM lk)
INSERT INTO %T (tenant_id, operation, key_hash, request_hash, state, generation, owner_token,
	lease_expires_at, takeovers, created_at, expires_at, retention_us, operation_digest)
SELECT $1::text, $2::text, $3::bytea, $4::text, 'processing',
	GREATEST($5::bigint, 1, %FLOOR), $6::uuid,
	c.now + $7::bigint * interval '1 microsecond', 0, c.now,
	c.now + $8::bigint * interval '1 microsecond', $8::bigint, $9::bytea
FROM c
ON CONFLICT DO NOTHING
RETURNING generation`

// insertFinishedSQL writes the record of a Do whose transaction is its lease
// (InsertAtCommit), finished (%S is the state), in the round trip of the
// COMMIT: $1 tenant, $2 operation, $3 key hash, $4 fingerprint,
// $5 generation, $6 owner, $7 status, $8 headers (the lossy jsonb copy),
// $9 headers byte for byte, $10 body, $11 version, $12 resource id,
// $13 retention µs, $14 operation digest.
//
// A plain INSERT: an existing row of the scope fails it with unique_violation
// (23505), after waiting for a transaction that holds the row or inserts it.
// A generation below the clock floor of a fresh claim (%FLOOR, as in claimSQL)
// fails it with division_by_zero (22012): the WHERE clause divides by zero
// then, on purpose, since an insert of no row would let the COMMIT that
// follows it commit the business write without its record. The divisor
// depends on clock_timestamp(), so the planner cannot fold it to an error.
const insertFinishedSQL = `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
INSERT INTO %T (tenant_id, operation, key_hash, request_hash, state, generation, owner_token,
	status_code, response_headers, response_headers_bin, response_body, response_version, resource_id,
	takeovers, created_at, completed_at, expires_at, retention_us, operation_digest)
SELECT $1::text, $2::text, $3::bytea, $4::text, '%S', $5::bigint, $6::uuid,
	$7::integer, $8::jsonb, $9::bytea, $10::bytea, $11::integer, $12::text,
	0, c.now, c.now, c.now + $13::bigint * interval '1 microsecond', $13::bigint, $14::bytea
FROM c` + insertFloorCheck

// insertAtCommitSQL is insertFinishedSQL as the write at commit sends it
// (WithWriteAtCommit): it takes the key's lock first, as every claim does,
// so that it waits for a Do that holds the key with no record yet (lock
// first) and then fails on its record, instead of committing beside it.
// An insert with LockFirst holds the lock already and sends
// insertFinishedSQL without its floor check.
var insertAtCommitSQL = strings.Replace(insertFinishedSQL,
	"WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)",
	"WITH lk AS MATERIALIZED (SELECT "+strings.ReplaceAll(keyLockSQL, "$9", "$14")+"),\nc AS MATERIALIZED (SELECT clock_timestamp() AS now FROM lk)", 1)

// insertFloorCheck is insertFinishedSQL's check of the clock floor, which
// an insert with LockFirst leaves out: its floor was checked at BEGIN.
const insertFloorCheck = `
WHERE 1 / (CASE WHEN $5::bigint >= %FLOOR THEN 1 ELSE 0 END) = 1`

// getSQL reads one record: $1 tenant, $2 operation, $3 key hash,
// $4 operation digest (keyArgs).
const getSQL = `SELECT ` + recCols + `
FROM %T r, (SELECT clock_timestamp() AS now) n
WHERE r.operation_digest = $4::bytea AND r.tenant_id = $1::text AND r.operation = $2::text AND r.key_hash = $3::bytea`

// operationSQL reads one record by its operation identity, within one
// tenant: $1 operation digest, $2 tenant.
const operationSQL = `SELECT ` + recCols + `
FROM %T r, (SELECT clock_timestamp() AS now) n
WHERE r.operation_digest = $1::bytea AND r.tenant_id = $2::text`

// fenceWhere matches the record AND its current token: $1 tenant,
// $2 operation, $3 key hash, $4 operation digest (keyArgs), $5 generation,
// $6 owner.
const fenceWhere = `WHERE operation_digest = $4::bytea AND tenant_id = $1::text AND operation = $2::text AND key_hash = $3::bytea
	AND generation = $5::bigint AND owner_token = $6::uuid`

// finishSQL completes or fails (%S is the state): $7 status, $8 headers
// (the lossy jsonb copy), $9 body, $10 version, $11 resource id, $12 headers
// byte for byte. The record keeps a full retention after it finished:
// expires_at = GREATEST(expires_at, now + retention), with a row written by
// the previous version (no retention_us) read as expires_at - created_at.
const finishSQL = `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE %T SET state = '%S', status_code = $7::integer, response_headers = $8::jsonb,
	response_headers_bin = $12::bytea,
	response_body = $9::bytea, response_version = $10::integer, resource_id = $11::text,
	completed_at = (SELECT now FROM c), lease_expires_at = NULL,
	expires_at = GREATEST(expires_at, (SELECT now FROM c)
		+ COALESCE(retention_us * interval '1 microsecond', expires_at - created_at))
` + fenceWhere + ` AND state IN ('processing', 'uncertain')`

const markUncertainSQL = `UPDATE %T SET state = 'uncertain', lease_expires_at = NULL
` + fenceWhere + ` AND state = 'processing'`

// renewSQL: $7 lease µs. An uncertain record is renewed only once adopted
// (its lease is set).
const renewSQL = `UPDATE %T SET lease_expires_at = clock_timestamp() + $7::bigint * interval '1 microsecond'
` + fenceWhere + ` AND (state = 'processing' OR (state = 'uncertain' AND lease_expires_at IS NOT NULL))`

// handoverSQL: $7 new owner, $8 lease µs. Returns the new generation.
const handoverSQL = `UPDATE %T SET generation = generation + 1, owner_token = $7::uuid,
	lease_expires_at = clock_timestamp() + $8::bigint * interval '1 microsecond'
` + fenceWhere + ` AND state = 'processing'
RETURNING generation`

// releaseSQL frees a processing record, or an uncertain one its adopter
// holds (its lease set: the Reconciler's resolve said nothing happened),
// which becomes released (processing, no owner).
const releaseSQL = `UPDATE %T SET state = 'processing', owner_token = NULL, lease_expires_at = NULL
` + fenceWhere + ` AND (state = 'processing' OR (state = 'uncertain' AND lease_expires_at IS NOT NULL))`

// adoptSQL: $1 tenant, $2 operation, $3 key hash, $4 operation digest
// (keyArgs), $5 proposed, $6 owner, $7 lease µs. Returns the new
// generation (NULL when nothing was adopted)
// and whether the record exists.
const adoptSQL = `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
u AS (
	UPDATE %T t SET generation = GREATEST($5::bigint, t.generation + 1), owner_token = $6::uuid,
		lease_expires_at = (SELECT now FROM c) + $7::bigint * interval '1 microsecond',
		takeovers = t.takeovers + 1
	WHERE t.operation_digest = $4::bytea AND t.tenant_id = $1::text AND t.operation = $2::text AND t.key_hash = $3::bytea
		AND ((t.state = 'uncertain' AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= (SELECT now FROM c)))
			OR (t.state = 'processing' AND t.owner_token IS NOT NULL AND t.lease_expires_at <= (SELECT now FROM c)))
	RETURNING t.generation
)
SELECT (SELECT generation FROM u),
	EXISTS (SELECT 1 FROM %T WHERE operation_digest = $4 AND tenant_id = $1 AND operation = $2 AND key_hash = $3)`

// pendingSQL: $1 stale-for µs, $2 limit. Fewest takeovers first, then
// oldest: every adoption counts one, so records the Reconciler could not
// resolve yet go behind the ones it has not tried as often, and more of
// them than a batch cannot hold the others back for ever.
const pendingSQL = `SELECT ` + recCols + `
FROM %T r, (SELECT clock_timestamp() AS now) n
WHERE r.state IN ('processing', 'uncertain')
	AND ((r.state = 'processing' AND r.owner_token IS NOT NULL
			AND r.lease_expires_at <= n.now - $1::bigint * interval '1 microsecond')
		OR (r.state = 'uncertain' AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= n.now)))
ORDER BY r.takeovers, r.created_at
LIMIT $2::integer`

// sweepSQL deletes at most $1 finished or released records past retention
// whose generation is below the sweep margin, skipping rows locked by a
// concurrent claim. It deletes by the digest, so it selects no row without
// one (written by an instance older than 003 until Migrate's 006 gives it
// one): such rows, oldest first, would fill every batch, delete nothing,
// and end the sweep with the rest of the backlog behind them. The records'
// steps (migration 008) go in the same statement; it returns the count of
// records deleted.
const sweepSQL = `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
v AS (
	SELECT operation_digest, tenant_id, operation, key_hash FROM %T
	WHERE (state IN ('completed', 'failed') OR (state = 'processing' AND owner_token IS NULL))
		AND expires_at <= (SELECT now FROM c)
		AND generation < %SWEEPMAX
		AND operation_digest IS NOT NULL
	ORDER BY expires_at
	LIMIT $1::integer
	FOR UPDATE SKIP LOCKED
),
d AS (
	DELETE FROM %T t USING v
	WHERE t.operation_digest = v.operation_digest AND t.tenant_id = v.tenant_id AND t.operation = v.operation
		AND t.key_hash = v.key_hash
	RETURNING t.operation_digest
),
st AS (DELETE FROM %ST s USING d WHERE s.operation_digest = d.operation_digest)
SELECT count(*) FROM d`

// statsExactSQL counts every record exactly in one sequential scan. Stats
// runs it only while the table is small (statsExactMaxPages); its cost grows
// with the table.
const statsExactSQL = `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
SELECT
	count(*) FILTER (WHERE state = 'processing' AND owner_token IS NOT NULL),
	count(*) FILTER (WHERE state = 'completed'),
	count(*) FILTER (WHERE state = 'failed'),
	count(*) FILTER (WHERE state = 'uncertain'),
	count(*) FILTER (WHERE state = 'processing' AND owner_token IS NULL),
	COALESCE((EXTRACT(EPOCH FROM ((SELECT now FROM c) - min(created_at) FILTER (WHERE expires_at > (SELECT now FROM c)))) * 1000000)::bigint, 0),
	count(*) FILTER (WHERE state = 'processing' AND owner_token IS NOT NULL AND lease_expires_at <= (SELECT now FROM c)),
	count(*) FILTER (WHERE (state IN ('completed', 'failed') OR (state = 'processing' AND owner_token IS NULL))
		AND expires_at <= (SELECT now FROM c)),
	count(*) FILTER (WHERE ((state = 'processing' AND owner_token IS NOT NULL) OR state = 'uncertain')
		AND expires_at <= (SELECT now FROM c)),
	COALESCE(sum(takeovers), 0)
FROM %T`

// statsSQL summarizes the table at a cost that does not grow with it. Each
// part reads one partial index (on a partitioned table, that index in every
// partition):
//
//   - u: processing and uncertain records (pending_idx), counted exactly:
//     leased, uncertain, released, stale, stuck, and the oldest unexpired;
//   - the sweep backlog (sweep_idx, expires_at up to now), exact;
//   - the finished or released record whose retention ends first
//     (sweep_idx, one row): the age of the oldest finished record, exact
//     when records share one retention;
//   - takeovers (takeovers_idx, 004: records taken over), exact;
//   - e: the completed and failed totals, estimated from the catalog: the
//     table's (or each partition's) row density at its last VACUUM or ANALYZE (reltuples /
//     relpages) times its current size in pages, split by the share of
//     each state ANALYZE sampled (pg_stats). e also returns the current
//     size in pages, which decides whether Stats counts exactly instead.
//
// The time is statement_timestamp(), stable within the statement, so the
// planner estimates the expiry ranges with it (an index range on a few
// rows), as it cannot with clock_timestamp().
const statsSQL = `SELECT u.leased, u.uncertain, u.released, u.stale, u.stuck,
	COALESCE((EXTRACT(EPOCH FROM (statement_timestamp() - LEAST(u.oldest, (
		SELECT f.created_at FROM %T f
		WHERE (f.state IN ('completed', 'failed') OR (f.state = 'processing' AND f.owner_token IS NULL))
			AND f.expires_at > statement_timestamp()
		ORDER BY f.expires_at LIMIT 1)))) * 1000000)::bigint, 0),
	(SELECT count(*) FROM %T w
		WHERE (w.state IN ('completed', 'failed') OR (w.state = 'processing' AND w.owner_token IS NULL))
			AND w.expires_at <= statement_timestamp()),
	(SELECT COALESCE(sum(k.takeovers), 0) FROM %T k WHERE k.takeovers > 0),
	e.completed, e.failed, e.pages
FROM (
	SELECT
		count(*) FILTER (WHERE state = 'processing' AND owner_token IS NOT NULL) AS leased,
		count(*) FILTER (WHERE state = 'uncertain') AS uncertain,
		count(*) FILTER (WHERE state = 'processing' AND owner_token IS NULL) AS released,
		count(*) FILTER (WHERE state = 'processing' AND owner_token IS NOT NULL
			AND lease_expires_at <= statement_timestamp()) AS stale,
		count(*) FILTER (WHERE ((state = 'processing' AND owner_token IS NOT NULL) OR state = 'uncertain')
			AND expires_at <= statement_timestamp()) AS stuck,
		min(created_at) FILTER (WHERE expires_at > statement_timestamp()) AS oldest
	FROM %T
	WHERE state IN ('processing', 'uncertain')
) u, (
	SELECT COALESCE(sum(l.rows * l.fc), 0)::bigint AS completed, COALESCE(sum(l.rows * l.ff), 0)::bigint AS failed,
		COALESCE(sum(l.pages), 0)::bigint AS pages
	FROM (
		SELECT s.pages,
			CASE WHEN c.reltuples < 0 THEN 0
				WHEN c.relpages = 0 THEN c.reltuples
				ELSE c.reltuples / c.relpages * s.pages END AS rows,
			COALESCE(st.most_common_freqs[array_position(st.most_common_vals::text::text[], 'completed')], 0) AS fc,
			COALESCE(st.most_common_freqs[array_position(st.most_common_vals::text::text[], 'failed')], 0) AS ff
		FROM (
			SELECT relid FROM pg_partition_tree(to_regclass('%T')) WHERE isleaf
			UNION ALL
			SELECT oid FROM pg_class WHERE oid = to_regclass('%T') AND relkind = 'r'
		) t
		JOIN pg_class c ON c.oid = t.relid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		CROSS JOIN LATERAL (SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages) s
		LEFT JOIN pg_stats st ON st.schemaname = n.nspname AND st.tablename = c.relname
			AND st.attname = 'state' AND NOT st.inherited
	) l
) e`

// setLockTimeoutSQL bounds lock waits for the rest of the (implicit)
// transaction; sent in the same round trip as the statement it guards.
const setLockTimeoutSQL = `SELECT set_config('lock_timeout', $1::text, true)`

// buildQueries fills in table (schema-qualified or not), whose name without
// the schema is name.
func buildQueries(table, name string) queries {
	ns := strconv.FormatInt(int64(lockNamespace(table)), 10)
	clock := func(at string) string { return strings.ReplaceAll(clockMs, "%C", at) }
	floor := "(" + clock("(SELECT now FROM c)") + " - " + strconv.Itoa(generationFloorLagMs) + ")"
	sweepMax := "(" + clock("(SELECT now FROM c)") + " - " + strconv.Itoa(sweepGenerationMarginMs) + ")"
	f := func(q, state string) string {
		return strings.NewReplacer("%NS", ns, "%SWEEPMAX", sweepMax, "%FLOOR", floor, "%PKEY", name+"_pkey", "%ST", table+"_steps", "%T", table, "%S", state).Replace(q)
	}
	return queries{
		claim:           f(claimSQL, ""),
		claimNew:        f(claimNewSQL, ""),
		get:             f(getSQL, ""),
		operation:       f(operationSQL, ""),
		handover:        f(handoverSQL, ""),
		complete:        f(finishSQL, "completed"),
		insertCompleted: f(insertAtCommitSQL, "completed"),
		insertFailed:    f(insertAtCommitSQL, "failed"),
		// With LockFirst the floor was checked at BEGIN (lockFirstSQL).
		insertCompletedLocked: f(strings.Replace(insertFinishedSQL, insertFloorCheck, "", 1), "completed"),
		insertFailedLocked:    f(strings.Replace(insertFinishedSQL, insertFloorCheck, "", 1), "failed"),
		fail:                  f(finishSQL, "failed"),
		markUncertain:         f(markUncertainSQL, ""),
		renew:                 f(renewSQL, ""),
		release:               f(releaseSQL, ""),
		adopt:                 f(adoptSQL, ""),
		pending:               f(pendingSQL, ""),
		sweep:                 f(sweepSQL, ""),
		stats:                 f(statsSQL, ""),
		statsExact:            f(statsExactSQL, ""),
		steps:                 buildStepQueries(func(q string) string { return f(q, "") }),
	}
}

// keyLock returns the second int of the key lock of digest d, as keyLockSQL
// computes it from the digest in SQL.
func keyLock(d [32]byte) int32 {
	return int32(uint32(d[0])<<24 | uint32(d[1])<<16 | uint32(d[2])<<8 | uint32(d[3]))
}

// lockFirstSQL is what a Do with LockFirst sends after its BEGIN, in the
// same simple-protocol message: the key's lock, then, in a statement of its
// own (READ COMMITTED takes a new snapshot per statement, so it sees a
// record committed by the lock's previous holder), a check that fails with
// division_by_zero (22012) when a record of the digest exists or when gen
// is below the clock floor of a fresh claim. The floor is checked here, at
// BEGIN, not at the INSERT after fn: a slow fn must not push a proposal
// under a floor that moved on while it ran. It is as sound here: a
// predecessor of the key swept before this BEGIN had a generation below
// the sweep's clock less sweepGenerationMarginMs, itself below the floor
// now, and none can be swept after it while this transaction holds the key
// with no record. Only integers and the digest's 64 hex digits are
// interpolated.
func (s *store) lockFirstSQL(d [32]byte, gen uint64) string {
	return "; select pg_advisory_xact_lock(" + strconv.FormatInt(int64(lockNamespace(s.table)), 10) + ", " + strconv.FormatInt(int64(keyLock(d)), 10) + ")" +
		"; select 1 / (not exists (select 1 from " + s.table + " where operation_digest = '\\x" + hex.EncodeToString(d[:]) + "'::bytea)" +
		" and " + strconv.FormatUint(gen, 10) + " >= " + strings.ReplaceAll(clockMs, "%C", "clock_timestamp()") + " - " + strconv.Itoa(generationFloorLagMs) + ")::int"
}
