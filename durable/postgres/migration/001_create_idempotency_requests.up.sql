-- 001_create_idempotency_requests.up.sql
-- The durable record of oncekey (see DESIGN.md). Plain SQL: golang-migrate
-- runs it as it is; Store.Migrate runs it inside a transaction serialized by
-- an advisory lock. Every statement is idempotent, so running it again is a
-- no-op. Store.Migrate replaces the name idempotency_requests with the
-- configured table name and creates the objects in the configured schema.

DO $$
BEGIN
	CREATE TYPE idempotency_state AS ENUM ('processing', 'completed', 'failed', 'uncertain');
EXCEPTION
	WHEN duplicate_object THEN NULL;
END
$$;

CREATE TABLE IF NOT EXISTS idempotency_requests (
	tenant_id        text              NOT NULL,
	operation        text              NOT NULL,
	key_hash         bytea             NOT NULL, -- SHA-256 (or HMAC-SHA-256) of the client key; never the key
	request_hash     text              NOT NULL, -- canon fingerprint
	state            idempotency_state NOT NULL,
	generation       bigint            NOT NULL, -- fencing token, monotonic per key
	owner_token      uuid,                       -- NULL once released
	lease_expires_at timestamptz,
	status_code      integer,
	response_headers jsonb,
	response_body    bytea,
	response_version integer,
	resource_id      text,
	takeovers        integer           NOT NULL DEFAULT 0,
	created_at       timestamptz       NOT NULL DEFAULT now(),
	completed_at     timestamptz,
	expires_at       timestamptz       NOT NULL,
	PRIMARY KEY (tenant_id, operation, key_hash),
	CONSTRAINT idempotency_requests_key_hash_len CHECK (octet_length(key_hash) = 32),
	CONSTRAINT idempotency_requests_generation_pos CHECK (generation >= 1)
);

-- Sweep: finished or released records, oldest expiry first.
CREATE INDEX IF NOT EXISTS idempotency_requests_sweep_idx ON idempotency_requests (expires_at)
	WHERE state IN ('completed', 'failed') OR (state = 'processing' AND owner_token IS NULL);

-- Pending (the reconciler) and Stats: records not finished, oldest first.
CREATE INDEX IF NOT EXISTS idempotency_requests_pending_idx ON idempotency_requests (created_at)
	WHERE state IN ('processing', 'uncertain');
