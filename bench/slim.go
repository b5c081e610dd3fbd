package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// slimTableSQL is the record issue 30.4 proposes, as a floor to measure, not
// a schema the library uses: the operation digest (32 bytes) as the primary
// key, so neither the claim nor the operations resource needs another
// B-tree; the fingerprint as its 32-byte digest and the state as one byte;
// the headers in their byte-exact form only (no jsonb copy); room on each
// page for the completion's new row version (fillfactor 80). %I is one of
// the index sets below.
const slimTableSQL = `CREATE TABLE %T (
	id bytea PRIMARY KEY,
	tenant_id text NOT NULL,
	operation text NOT NULL,
	key_hash bytea NOT NULL,
	request_hash bytea NOT NULL,
	state "char" NOT NULL,
	generation bigint NOT NULL,
	owner_token uuid,
	lease_expires_at timestamptz,
	status_code integer,
	response_headers_bin bytea,
	response_body bytea,
	response_version integer,
	resource_id text,
	takeovers integer NOT NULL DEFAULT 0,
	created_at timestamptz NOT NULL,
	completed_at timestamptz,
	expires_at timestamptz NOT NULL,
	retention_us bigint NOT NULL
) WITH (fillfactor = 80);
%I`

// The slim record's index sets, each a floor of its own:
//
//   - slimHotIndexes (floor-slim-claim-first): a plain B-tree on the
//     expiry for the sweep and nothing else, so the completion is a HOT
//     update (the claim sets the expiry a lease past the retention, so a
//     completion within its lease leaves it as it is). Pending would have
//     to read the whole table.
//   - slimPendingIndexes (floor-slim-pending-claim-first): today's two
//     partial indexes, the sweep's (finished records by expiry) and
//     Pending's (unfinished records by age); their predicates name the
//     state, so every completion is a non-HOT update on PostgreSQL 15.
//
// A BRIN index on the expiry is not among them: after ten rounds of sweeping
// 10% of a table and inserting as many records, the new rows fill the
// space the sweep freed, every block range spans old and new expiries, and
// the sweep's query read the whole table (50,003 of 50,000 pages) where a
// B-tree read 55 (bench/README.md).
const (
	slimHotIndexes     = `CREATE INDEX ON %T (expires_at)`
	slimPendingIndexes = `CREATE INDEX ON %T (expires_at) WHERE state IN ('c', 'f');
CREATE INDEX ON %T (created_at) WHERE state IN ('p', 'u')`
)

// createSlim creates the slim record table with the index set indexes.
func createSlim(ctx context.Context, e *env, table, indexes string) error {
	sql := strings.ReplaceAll(strings.ReplaceAll(slimTableSQL, "%I", indexes), "%T", table)
	_, err := e.pool.Exec(ctx, sql)
	return err
}

// slimClaimSQL claims a key in the slim record: $1 digest, $2 tenant,
// $3 operation, $4 key hash, $5 fingerprint digest, $6 proposed generation,
// $7 owner, $8 lease µs, $9 retention µs.
const slimClaimSQL = `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
INSERT INTO %T (id, tenant_id, operation, key_hash, request_hash, state, generation, owner_token,
	lease_expires_at, created_at, expires_at, retention_us)
SELECT $1::bytea, $2::text, $3::text, $4::bytea, $5::bytea, 'p', GREATEST($6::bigint, 1), $7::uuid,
	c.now + $8::bigint * interval '1 microsecond', c.now,
	c.now + ($8::bigint + $9::bigint) * interval '1 microsecond', $9::bigint
FROM c
ON CONFLICT (id) DO NOTHING
RETURNING generation`

// slimFinishSQL completes a slim record, fenced: $1 digest, $2 generation,
// $3 owner, $4 status, $5 headers, $6 body, $7 version, $8 resource id.
const slimFinishSQL = `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE %T SET state = 'c', status_code = $4::integer, response_headers_bin = $5::bytea,
	response_body = $6::bytea, response_version = $7::integer, resource_id = $8::text,
	completed_at = (SELECT now FROM c), lease_expires_at = NULL,
	expires_at = GREATEST(expires_at, (SELECT now FROM c) + retention_us * interval '1 microsecond')
WHERE id = $1::bytea AND generation = $2::bigint AND owner_token = $3::uuid AND state IN ('p', 'u')`

// slimStatements are the claim and the completion on one slim table.
type slimStatements struct{ claim, finish string }

func slimFor(table string) slimStatements {
	return slimStatements{strings.ReplaceAll(slimClaimSQL, "%T", table), strings.ReplaceAll(slimFinishSQL, "%T", table)}
}

// fingerprintDigest is the workloads' fingerprint in the slim record's
// compact form: the 32 bytes its hex stands for.
var fingerprintDigest, _ = hex.DecodeString(strings.TrimPrefix(fingerprint, "v1:"))

// slimCopySQL fills the slim record table %S from the library's table %T,
// row for row, in its compact forms; recordSize measures both.
const slimCopySQL = `INSERT INTO %S (id, tenant_id, operation, key_hash, request_hash, state, generation, owner_token,
	lease_expires_at, status_code, response_headers_bin, response_body, response_version, resource_id, takeovers,
	created_at, completed_at, expires_at, retention_us)
SELECT operation_digest, tenant_id, operation, key_hash, decode(substr(request_hash, 4), 'hex'),
	CASE state WHEN 'processing' THEN 'p' WHEN 'completed' THEN 'c' WHEN 'failed' THEN 'f' ELSE 'u' END,
	generation, owner_token, lease_expires_at, status_code, response_headers_bin, response_body, response_version,
	resource_id, takeovers, created_at, completed_at, expires_at, retention_us
FROM %T`

// slimClaimFirst is floor-claim-new's protocol on a slim record table (s,
// its statements): the library's BEGIN, the claim insert, the order INSERT,
// then the fenced completion and COMMIT in one pipeline.
func (f *floors) slimClaimFirst(ctx context.Context, s slimStatements, key string) (outcome, error) {
	h := sha256.Sum256([]byte(key))
	digest := sha256.Sum256(h[:])
	owner := uuid.New()
	return f.claimThenComplete(ctx, key, f.beginSQL, func(tx pgx.Tx) (int64, error) {
		var gen int64
		err := tx.QueryRow(ctx, s.claim, digest[:], tenant, operation, h[:], fingerprintDigest, int64(0), pgUUID(owner),
			leaseUs, retentionUs).Scan(&gen)
		return gen, err
	}, func(gen int64) (string, []any) {
		return s.finish, []any{digest[:], gen, pgUUID(owner),
			result.StatusCode, f.binHeaders, result.Body, result.Version, result.ResourceID}
	})
}
