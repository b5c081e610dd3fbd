-- 002_retention_and_binary_headers.down.sql
-- Drops the columns 002 added. Response headers stay readable from the JSON
-- copy (bytes 0x80-0xFF of a value read back as U+FFFD, as before 002).

ALTER TABLE idempotency_requests DROP COLUMN response_headers_bin;
ALTER TABLE idempotency_requests DROP COLUMN retention_us;
