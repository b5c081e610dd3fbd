-- 001_create_idempotency_requests.up.sql
-- The durable record of one idempotency key (see package durable). Times are
-- integer microseconds since the Unix epoch, taken from the database's clock.
-- Idempotent: safe to run again on a migrated database.

CREATE TABLE IF NOT EXISTS idempotency_requests (
  tenant_id        TEXT    NOT NULL,
  operation        TEXT    NOT NULL,
  -- SHA-256 (or HMAC-SHA-256) of the client key; the raw key is never stored.
  key_hash         BLOB    NOT NULL CHECK (length(key_hash) = 32),
  request_hash     TEXT    NOT NULL,
  state            TEXT    NOT NULL
                   CHECK (state IN ('processing', 'completed', 'failed', 'uncertain')),
  -- The fencing generation: it only rises for a key.
  generation       INTEGER NOT NULL CHECK (generation >= 1),
  -- NULL for a released record (state processing).
  owner_token      TEXT    CHECK (owner_token IS NULL OR length(owner_token) = 36),
  lease_expires_at INTEGER,
  status_code      INTEGER,
  response_headers TEXT,
  response_body    BLOB,
  response_version INTEGER,
  resource_id      TEXT,
  takeovers        INTEGER NOT NULL DEFAULT 0,
  -- How the current owner got the record: insert, takeover, restart or adopt.
  acquired_via     TEXT    NOT NULL DEFAULT 'insert'
                   CHECK (acquired_via IN ('insert', 'takeover', 'restart', 'adopt')),
  created_at       INTEGER NOT NULL,
  completed_at     INTEGER,
  expires_at       INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, operation, key_hash)
) STRICT, WITHOUT ROWID;

-- Sweep: finished and released records by retention.
CREATE INDEX IF NOT EXISTS idempotency_requests_sweep_idx
  ON idempotency_requests (expires_at)
  WHERE state IN ('completed', 'failed') OR owner_token IS NULL;

-- Reconciler and stats: unfinished records by lease.
CREATE INDEX IF NOT EXISTS idempotency_requests_pending_idx
  ON idempotency_requests (lease_expires_at)
  WHERE state IN ('processing', 'uncertain');
