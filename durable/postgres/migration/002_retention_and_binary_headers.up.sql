-- 002_retention_and_binary_headers.up.sql
-- Adds two columns to idempotency_requests:
--
--   retention_us          the record's retention in microseconds, written by
--                         every claim. A finishing write (Complete, Fail) sets
--                         expires_at = GREATEST(expires_at, its database time +
--                         retention), so a record finished late (a long
--                         workflow, a reconciliation) keeps a full retention
--                         after it finished instead of being already expired.
--                         Existing rows get expires_at - created_at.
--   response_headers_bin  the response headers byte for byte (format "h1" of
--                         oncekey's durable/internal/headers). The jsonb column
--                         turns bytes 0x80-0xFF of a header value into U+FFFD,
--                         so a stored result no longer equalled the one
--                         written. Existing rows are converted from
--                         response_headers.
--
-- response_headers (jsonb) stays and is still written, as a lossy copy, so
-- that an instance of the previous version (during a rolling deploy, or after
-- the down migration) still replays headers. Both new columns are nullable for
-- the same reason: a row written by the previous version has neither, and the
-- store then reads expires_at - created_at and response_headers.
--
-- Plain SQL: golang-migrate runs it as it is. Store.Migrate runs it on every
-- start; the DO block adds and fills the columns only once (the conversion
-- rewrites every row: run it at a quiet time on a large table).

DO $$
BEGIN
	IF to_regclass('idempotency_requests') IS NOT NULL AND NOT EXISTS (
		SELECT 1 FROM pg_attribute
		WHERE attrelid = to_regclass('idempotency_requests') AND attname = 'retention_us' AND NOT attisdropped
	) THEN
		ALTER TABLE idempotency_requests
			ADD COLUMN IF NOT EXISTS retention_us bigint,
			ADD COLUMN IF NOT EXISTS response_headers_bin bytea;
		ALTER TABLE idempotency_requests ADD CONSTRAINT idempotency_requests_retention_pos
			CHECK (retention_us IS NULL OR retention_us >= 0);
		UPDATE idempotency_requests SET
			retention_us = GREATEST(0, (EXTRACT(EPOCH FROM (expires_at - created_at)) * 1000000)::bigint),
			response_headers_bin = CASE WHEN jsonb_typeof(response_headers) = 'object' THEN
				convert_to('h1', 'UTF8') || COALESCE((
					SELECT string_agg(
						convert_to(length(convert_to(f.key, 'UTF8'))::text || ':', 'UTF8') || convert_to(f.key, 'UTF8')
							|| convert_to(v.n::text || ':', 'UTF8') || v.vals,
						''::bytea ORDER BY convert_to(f.key, 'UTF8'))
					FROM jsonb_each(response_headers) AS f(key, value),
					LATERAL (
						SELECT count(*) AS n, COALESCE(string_agg(
							convert_to(length(convert_to(e.v, 'UTF8'))::text || ':', 'UTF8') || convert_to(e.v, 'UTF8'),
							''::bytea ORDER BY e.o), ''::bytea) AS vals
						FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(f.value) = 'array' THEN f.value ELSE '[]'::jsonb END)
							WITH ORDINALITY AS e(v, o)
					) AS v
				), ''::bytea)
			END;
	END IF;
END
$$;
