-- 002_retention_and_binary_headers.up.sql
-- Adds two columns to idempotency_requests:
--
--   retention_us          the record's retention in microseconds, written by
--                         every claim. A finishing write (Complete, Fail) sets
--                         expires_at = max(expires_at, its database time +
--                         retention), so a record finished late keeps a full
--                         retention after it finished instead of being already
--                         expired. Existing rows get expires_at - created_at.
--   response_headers_bin  the response headers byte for byte (format "h1" of
--                         oncekey's durable/internal/headers). The JSON column
--                         turns bytes 0x80-0xFF of a header value into U+FFFD.
--                         Existing rows are converted from response_headers.
--
-- response_headers (JSON) stays and is still written, as a lossy copy, so that
-- the previous version (after the down migration) still replays headers. Both
-- new columns are nullable: a row written by the previous version has neither,
-- and the store then reads expires_at - created_at and response_headers.
--
-- Not idempotent (SQLite has no ADD COLUMN IF NOT EXISTS): Store.Migrate
-- records the versions it applied in table oncekey_migration and runs each
-- once; goose and golang-migrate keep their own record.

ALTER TABLE idempotency_requests ADD COLUMN retention_us INTEGER CHECK (retention_us IS NULL OR retention_us >= 0);
ALTER TABLE idempotency_requests ADD COLUMN response_headers_bin BLOB;

UPDATE idempotency_requests SET
  retention_us = max(0, expires_at - created_at),
  response_headers_bin = CASE WHEN json_type(response_headers) = 'object' THEN
    CAST('h1' || coalesce((
      SELECT group_concat(
          length(CAST(f.key AS BLOB)) || ':' || f.key
          || (SELECT count(*) || ':' || coalesce(group_concat(length(CAST(e.value AS BLOB)) || ':' || e.value, '' ORDER BY e.key), '')
              FROM json_each(CASE WHEN f.type = 'array' THEN f.value ELSE '[]' END) AS e),
          '' ORDER BY CAST(f.key AS BLOB))
      FROM json_each(response_headers) AS f
    ), '') AS BLOB)
  END;
