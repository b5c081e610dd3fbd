package sqlite

import "strings"

// now is the database's clock in integer microseconds since the Unix epoch.
// SQLite's 'now' has millisecond resolution and is the same for every use
// within one statement step, so a statement sees one instant throughout.
const now = `(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)`

// recordCols is the column list scanned by scanRecord. Lease remaining and
// time to expiry are computed by the database, never by the worker.
const recordCols = `tenant_id, operation, key_hash, request_hash, state, generation, owner_token,
	CASE WHEN lease_expires_at > ` + now + ` THEN lease_expires_at - ` + now + ` ELSE 0 END,
	status_code, response_headers, response_body, response_version, resource_id,
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
	lock, claim, claimRead, get                    string
	complete, markUncertain, renew, release, adopt string
	adoptable, pending, sweep, stats               string
}

func buildQueries(table string) queries {
	r := strings.NewReplacer("{t}", table)
	return queries{
		lock: r.Replace(`UPDATE {t} SET generation = generation WHERE 0`),

		// ?1-?3 pk, ?4 fingerprint, ?5 proposed, ?6 owner, ?7 lease µs,
		// ?8 retention µs. The proposed row (excluded) carries the
		// statement's clock in created_at; unqualified columns in DO UPDATE
		// are the stored row's. When the rule refuses, nothing is written
		// and nothing returned. A takeover keeps the operation (creation,
		// retention); a restart (released, or finished and past retention)
		// starts a new one and clears the result.
		claim: r.Replace(strings.NewReplacer("{takeover}", takeoverRule).Replace(
			`INSERT INTO {t} (tenant_id, operation, key_hash, request_hash, state,
	generation, owner_token, lease_expires_at, takeovers, acquired_via, created_at, expires_at)
VALUES (?1, ?2, ?3, ?4, 'processing', max(?5, 1), ?6, ` + now + ` + ?7, 0, 'insert', ` + now + `, ` + now + ` + ?8)
ON CONFLICT (tenant_id, operation, key_hash) DO UPDATE SET
	generation       = max(excluded.generation, generation + 1),
	owner_token      = excluded.owner_token,
	lease_expires_at = excluded.lease_expires_at,
	state            = 'processing',
	takeovers        = takeovers + {takeover},
	acquired_via     = CASE WHEN {takeover} THEN 'takeover' ELSE 'restart' END,
	request_hash     = excluded.request_hash,
	created_at       = CASE WHEN {takeover} THEN created_at ELSE excluded.created_at END,
	expires_at       = CASE WHEN {takeover} THEN expires_at ELSE excluded.expires_at END,
	status_code = NULL, response_headers = NULL, response_body = NULL,
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

		// ?6 state ('completed' or 'failed'), ?7 status, ?8 headers JSON,
		// ?9 body, ?10 version, ?11 resource id.
		complete: r.Replace(`UPDATE {t} SET state = ?6, status_code = ?7, response_headers = ?8,
	response_body = ?9, response_version = ?10, resource_id = ?11,
	completed_at = ` + now + `, lease_expires_at = NULL
WHERE ` + fenced + ` AND state IN ('processing', 'uncertain')`),

		markUncertain: r.Replace(`UPDATE {t} SET state = 'uncertain', lease_expires_at = NULL
WHERE ` + fenced + ` AND state = 'processing'`),

		// ?6 lease µs. An uncertain record is renewed only once adopted
		// (MarkUncertain cleared its lease; Adopt set one).
		renew: r.Replace(`UPDATE {t} SET lease_expires_at = ` + now + ` + ?6
WHERE ` + fenced + ` AND (state = 'processing'
	OR (state = 'uncertain' AND lease_expires_at IS NOT NULL))`),

		release: r.Replace(`UPDATE {t} SET owner_token = NULL, lease_expires_at = NULL
WHERE ` + fenced + ` AND state = 'processing'`),

		// ?4 owner, ?5 proposed, ?6 lease µs.
		adopt: r.Replace(`UPDATE {t} SET generation = max(?5, generation + 1), owner_token = ?4,
	lease_expires_at = ` + now + ` + ?6, takeovers = takeovers + 1, acquired_via = 'adopt'
WHERE ` + pk + ` AND (
	(state = 'uncertain' AND (lease_expires_at IS NULL OR lease_expires_at <= ` + now + `))
	OR (state = 'processing' AND owner_token IS NOT NULL AND lease_expires_at <= ` + now + `))
RETURNING generation`),

		adoptable: r.Replace(`SELECT count(*) FROM {t} WHERE ` + pk),

		// ?1 stale µs, ?2 limit.
		pending: r.Replace(`SELECT ` + recordCols + ` FROM {t}
WHERE state IN ('processing', 'uncertain') AND (
	(state = 'uncertain' AND (lease_expires_at IS NULL OR lease_expires_at <= ` + now + `))
	OR (state = 'processing' AND owner_token IS NOT NULL AND lease_expires_at <= ` + now + ` - ?1))
ORDER BY created_at, tenant_id, operation, key_hash
LIMIT ?2`),

		// ?1 batch. Bounded, and on the sweep index, so the write lock is
		// held briefly.
		sweep: r.Replace(`DELETE FROM {t} WHERE (tenant_id, operation, key_hash) IN (
	SELECT tenant_id, operation, key_hash FROM {t}
	WHERE (state IN ('completed', 'failed') OR owner_token IS NULL) AND expires_at <= ` + now + `
	ORDER BY expires_at LIMIT ?1)`),

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
	}
}
