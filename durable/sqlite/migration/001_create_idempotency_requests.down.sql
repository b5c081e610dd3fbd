-- 001_create_idempotency_requests.down.sql
-- Drops what the up migration created. Idempotent.

DROP INDEX IF EXISTS idempotency_requests_pending_idx;
DROP INDEX IF EXISTS idempotency_requests_sweep_idx;
DROP TABLE IF EXISTS idempotency_requests;
