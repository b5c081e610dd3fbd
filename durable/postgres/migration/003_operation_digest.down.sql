-- 003_operation_digest.down.sql
-- Drops what 003 added: operations can no longer be read by their identity
-- (the identity itself, derived from tenant, operation and key hash, does
-- not change, so running 003 again serves the same identities).

DROP INDEX IF EXISTS idempotency_requests_operation_idx;

ALTER TABLE IF EXISTS idempotency_requests
	DROP CONSTRAINT IF EXISTS idempotency_requests_operation_digest_len,
	DROP COLUMN IF EXISTS operation_digest;
