-- 002_retention_and_binary_headers.down.sql
-- Drops the columns 002 added. Response headers stay readable from the jsonb
-- copy (bytes 0x80-0xFF of a value read back as U+FFFD, as before 002), and a
-- record finished after this keeps expires_at from its claim again.

ALTER TABLE IF EXISTS idempotency_requests
	DROP CONSTRAINT IF EXISTS idempotency_requests_retention_pos,
	DROP COLUMN IF EXISTS retention_us,
	DROP COLUMN IF EXISTS response_headers_bin;
