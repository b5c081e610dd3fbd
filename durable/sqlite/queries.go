package sqlite

import (
	"strconv"
	"strings"
)

// The generation floor and the sweep margin, in milliseconds of the
// database's clock (nowMs). Why they keep generations rising per scope
// across Sweep, and what they assume of the clock, is told once, in
// package durable's documentation (# Generations).
const (
	generationFloorLagMs    = 60_000
	sweepGenerationMarginMs = 120_000
)

// now is the database's clock in integer microseconds since the Unix epoch.
// SQLite's 'now' has millisecond resolution and is the same for every use
// within one statement step, so a statement sees one instant throughout.
const now = `(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)`

// nowMs is the database's clock in whole milliseconds since the Unix epoch.
const nowMs = `(` + now + ` / 1000)`

// generationFloor is the least generation of a created or restarted record.
var generationFloor = `(` + nowMs + ` - ` + strconv.Itoa(generationFloorLagMs) + `)`

// sweepMax bounds the generations Sweep may delete (strictly below it).
var sweepMax = `(` + nowMs + ` - ` + strconv.Itoa(sweepGenerationMarginMs) + `)`

// recordCols is the column list scanned by scanRecord. Lease remaining and
// time to expiry are computed by the database, never by the worker.
const recordCols = `tenant_id, operation, key_hash, request_hash, state, generation, owner_token,
	CASE WHEN lease_expires_at > ` + now + ` THEN lease_expires_at - ` + now + ` ELSE 0 END,
	status_code, response_headers, response_headers_bin, response_body, response_version, resource_id,
	takeovers, created_at, completed_at, expires_at, expires_at - ` + now

// pk matches one record; ?1 tenant, ?2 operation, ?3 key hash.
const pk = `tenant_id = ?1 AND operation = ?2 AND key_hash = ?3`

// fenced matches the caller's token; ?4 owner, ?5 generation.
const fenced = pk + ` AND owner_token = ?4 AND generation = ?5`

// claimRule is the claim rule on the stored row in DO UPDATE's WHERE, with
// excluded.created_at as the statement's clock: (a) takeover of an expired
// lease of the same request, (b) a released record, (c) a finished record
// past retention.
const claimRule = `((state = 'processing' AND owner_token IS NOT NULL
		AND lease_expires_at <= excluded.created_at AND request_hash = excluded.request_hash)
	OR (state = 'processing' AND owner_token IS NULL)
	OR (state IN ('completed', 'failed') AND expires_at <= excluded.created_at))`

// takeoverRule tells case (a) from (b) and (c) once claimRule held; in
// DO UPDATE's SET it reads the stored row, as every SET expression does.
const takeoverRule = `(state = 'processing' AND owner_token IS NOT NULL)`

type queries struct {
	lock, claim, claimRead, get, operation, handover string
	complete, markUncertain, renew, release, adopt   string
	adoptable, pending, sweep, sweepSteps, stats     string
	steps                                            stepQueries
}

func buildQueries(table string) queries {
	r := strings.NewReplacer("{t}", table)
	return queries{
		lock: r.Replace(`UPDATE {t} SET generation = generation WHERE 0`),

		// ?1-?3 pk, ?4 fingerprint, ?5 proposed, ?6 owner, ?7 lease µs,
		// ?8 retention µs, ?9 operation digest (durable.Ref.Digest). The proposed row (excluded) carries the
		// statement's clock in created_at; unqualified columns in DO UPDATE
		// are the stored row's. When the rule refuses, nothing is written
		// and nothing returned. A takeover keeps the operation (creation,
		// retention); a restart (released, or finished and past retention)
		// starts a new one and clears the result. The generation of a
		// takeover is max(?5, stored+1); of an insert or a restart it is
		// also at least the clock floor (excluded.generation carries it).
		// A takeover raises expires_at to a full retention from now and
		// keeps the longer retention. A restart's created_at is the
		// operation's life, which its steps (migration 004) are recorded
		// under: it is now, but strictly above the stored one, since the
		// clock has only millisecond resolution and a release and the next
		// claim may fall in the same millisecond; a new operation must
		// never see the steps of the one before.
		claim: r.Replace(strings.NewReplacer("{takeover}", takeoverRule).Replace(
			`INSERT INTO {t} (tenant_id, operation, key_hash, request_hash, state,
	generation, owner_token, lease_expires_at, takeovers, acquired_via, created_at, expires_at, retention_us,
	operation_digest)
VALUES (?1, ?2, ?3, ?4, 'processing', max(?5, 1, ` + generationFloor + `), ?6, ` + now + ` + ?7, 0, 'insert',
	` + now + `, ` + now + ` + ?8, ?8, ?9)
ON CONFLICT (tenant_id, operation, key_hash) DO UPDATE SET
	generation       = CASE WHEN {takeover} THEN max(?5, generation + 1)
		ELSE max(excluded.generation, generation + 1) END,
	retention_us     = CASE WHEN {takeover} THEN max(coalesce(retention_us, 0), excluded.retention_us)
		ELSE excluded.retention_us END,
	owner_token      = excluded.owner_token,
	lease_expires_at = excluded.lease_expires_at,
	state            = 'processing',
	takeovers        = takeovers + {takeover},
	acquired_via     = CASE WHEN {takeover} THEN 'takeover' ELSE 'restart' END,
	request_hash     = excluded.request_hash,
	operation_digest = excluded.operation_digest,
	created_at       = CASE WHEN {takeover} THEN created_at ELSE max(excluded.created_at, created_at + 1) END,
	expires_at       = CASE WHEN {takeover} THEN max(expires_at, excluded.expires_at) ELSE excluded.expires_at END,
	status_code = NULL, response_headers = NULL, response_headers_bin = NULL, response_body = NULL,
	response_version = NULL, resource_id = NULL, completed_at = NULL
WHERE ` + claimRule + `
RETURNING generation, acquired_via`)),

		// The record after a claim that wrote nothing, and whether the claim
		// rule would accept it now (the claim is then tried again). ?4
		// fingerprint.
		claimRead: r.Replace(`SELECT ` + recordCols + `,
	(state = 'processing' AND owner_token IS NOT NULL AND lease_expires_at <= ` + now + ` AND request_hash = ?4)
	OR (state = 'processing' AND owner_token IS NULL)
	OR (state IN ('completed', 'failed') AND expires_at <= ` + now + `)
FROM {t} WHERE ` + pk),

		get: r.Replace(`SELECT ` + recordCols + ` FROM {t} WHERE ` + pk),

		// A record by its operation identity within one tenant: ?1
		// operation digest, ?2 tenant.
		operation: r.Replace(`SELECT ` + recordCols + ` FROM {t} WHERE operation_digest = ?1 AND tenant_id = ?2`),

		// ?6 state ('completed' or 'failed'), ?7 status, ?8 headers JSON
		// (the lossy copy), ?9 body, ?10 version, ?11 resource id, ?12
		// headers byte for byte. The record keeps a full retention after it
		// finished (a row of the previous version, without retention_us,
		// reads it as expires_at - created_at).
		complete: r.Replace(`UPDATE {t} SET state = ?6, status_code = ?7, response_headers = ?8,
	response_headers_bin = ?12, response_body = ?9, response_version = ?10, resource_id = ?11,
	completed_at = ` + now + `, lease_expires_at = NULL,
	expires_at = max(expires_at, ` + now + ` + coalesce(retention_us, expires_at - created_at))
WHERE ` + fenced + ` AND state IN ('processing', 'uncertain')`),

		markUncertain: r.Replace(`UPDATE {t} SET state = 'uncertain', lease_expires_at = NULL
WHERE ` + fenced + ` AND state = 'processing'`),

		// ?6 lease µs. An uncertain record is renewed only once adopted
		// (MarkUncertain cleared its lease; Adopt set one).
		// ?6 new owner, ?7 lease µs.
		handover: r.Replace(`UPDATE {t} SET generation = generation + 1, owner_token = ?6,
	lease_expires_at = ` + now + ` + ?7
WHERE ` + fenced + ` AND state = 'processing'
RETURNING generation`),

		renew: r.Replace(`UPDATE {t} SET lease_expires_at = ` + now + ` + ?6
WHERE ` + fenced + ` AND (state = 'processing'
	OR (state = 'uncertain' AND lease_expires_at IS NOT NULL))`),

		// A processing record, or an uncertain one its adopter holds (its
		// lease set), becomes released (processing, no owner).
		release: r.Replace(`UPDATE {t} SET state = 'processing', owner_token = NULL, lease_expires_at = NULL
WHERE ` + fenced + ` AND (state = 'processing' OR (state = 'uncertain' AND lease_expires_at IS NOT NULL))`),

		// ?4 owner, ?5 proposed, ?6 lease µs.
		adopt: r.Replace(`UPDATE {t} SET generation = max(?5, generation + 1), owner_token = ?4,
	lease_expires_at = ` + now + ` + ?6, takeovers = takeovers + 1, acquired_via = 'adopt'
WHERE ` + pk + ` AND (
	(state = 'uncertain' AND (lease_expires_at IS NULL OR lease_expires_at <= ` + now + `))
	OR (state = 'processing' AND owner_token IS NOT NULL AND lease_expires_at <= ` + now + `))
RETURNING generation`),

		adoptable: r.Replace(`SELECT count(*) FROM {t} WHERE ` + pk),

		// ?1 stale µs, ?2 limit. Fewest takeovers first, then oldest (see
		// the PostgreSQL store's pendingSQL).
		pending: r.Replace(`SELECT ` + recordCols + ` FROM {t}
WHERE state IN ('processing', 'uncertain') AND (
	(state = 'uncertain' AND (lease_expires_at IS NULL OR lease_expires_at <= ` + now + `))
	OR (state = 'processing' AND owner_token IS NOT NULL AND lease_expires_at <= ` + now + ` - ?1))
ORDER BY takeovers, created_at, tenant_id, operation, key_hash
LIMIT ?2`),

		// ?1 batch. Bounded, and on the sweep index, so the write lock is
		// held briefly. A record whose generation is not below the sweep
		// margin stays until the clock passes it. It returns the digest of
		// each record it deleted (NULL for a row from before 003, which has
		// no steps), whose steps sweepSteps then deletes in the same
		// transaction.
		sweep: r.Replace(`DELETE FROM {t} WHERE (tenant_id, operation, key_hash) IN (
	SELECT tenant_id, operation, key_hash FROM {t}
	WHERE (state IN ('completed', 'failed') OR owner_token IS NULL) AND expires_at <= ` + now + `
		AND generation < ` + sweepMax + `
	ORDER BY expires_at LIMIT ?1)
RETURNING operation_digest`),

		// ?1 the digest of a swept record: its steps, of every life.
		sweepSteps: r.Replace(`DELETE FROM {t}_steps WHERE operation_digest = ?1`),

		stats: r.Replace(`SELECT
	coalesce(sum(state = 'processing' AND owner_token IS NOT NULL), 0),
	coalesce(sum(state = 'completed'), 0),
	coalesce(sum(state = 'failed'), 0),
	coalesce(sum(state = 'uncertain'), 0),
	coalesce(sum(state = 'processing' AND owner_token IS NULL), 0),
	coalesce(` + now + ` - min(CASE WHEN expires_at > ` + now + ` THEN created_at END), 0),
	coalesce(sum(state = 'processing' AND owner_token IS NOT NULL AND lease_expires_at <= ` + now + `), 0),
	coalesce(sum((state IN ('completed', 'failed') OR owner_token IS NULL) AND expires_at <= ` + now + `), 0),
	coalesce(sum(state IN ('processing', 'uncertain') AND owner_token IS NOT NULL AND expires_at <= ` + now + `), 0),
	coalesce(sum(takeovers), 0)
FROM {t}`),

		steps: buildStepQueries(table),
	}
}
