-- 003_operation_digest.down.sql
-- Drops what 003 added: operations can no longer be read by their identity
-- (the identity itself does not change, so running 003 again serves the
-- same identities).

DROP INDEX IF EXISTS idempotency_requests_operation_idx;
ALTER TABLE idempotency_requests DROP COLUMN operation_digest;
