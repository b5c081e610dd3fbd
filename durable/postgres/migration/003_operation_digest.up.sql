-- 003_operation_digest.up.sql
-- Adds operation_digest to idempotency_requests: the 32-byte digest behind
-- the record's operation identity, so a record can be read by the identity
-- the Claimer hands out ("op_" + base64url(digest), see durable.Ref
-- OperationID) with one indexed read, scoped by tenant_id.
--
-- The digest is SHA-256 over the length-prefixed fields "oncekey/ref/v1",
-- tenant_id, operation and key_hash (each preceded by its length in bytes as
-- a big-endian 64-bit integer), exactly as durable.Ref.Digest computes it.
-- Existing rows get theirs here; every claim writes it from then on. The
-- column is nullable so that an instance of the previous version (during a
-- rolling deploy) can still insert: a row it creates gets its digest at its
-- next claim, and until then is not found by its operation identity.
--
-- Plain SQL: golang-migrate runs it as it is. Store.Migrate runs it on every
-- start; the DO block adds and fills the column only once (the backfill
-- rewrites every row: run it at a quiet time on a large table).

DO $$
BEGIN
	IF to_regclass('idempotency_requests') IS NOT NULL AND NOT EXISTS (
		SELECT 1 FROM pg_attribute
		WHERE attrelid = to_regclass('idempotency_requests') AND attname = 'operation_digest' AND NOT attisdropped
	) THEN
		ALTER TABLE idempotency_requests ADD COLUMN IF NOT EXISTS operation_digest bytea;
		ALTER TABLE idempotency_requests ADD CONSTRAINT idempotency_requests_operation_digest_len
			CHECK (operation_digest IS NULL OR octet_length(operation_digest) = 32);
		UPDATE idempotency_requests SET operation_digest = sha256(
			int8send(14::bigint) || convert_to('oncekey/ref/v1', 'UTF8')
			|| int8send(octet_length(convert_to(tenant_id, 'UTF8'))::bigint) || convert_to(tenant_id, 'UTF8')
			|| int8send(octet_length(convert_to(operation, 'UTF8'))::bigint) || convert_to(operation, 'UTF8')
			|| int8send(octet_length(key_hash)::bigint) || key_hash);
	END IF;
END
$$;

-- The operation resource: by digest, then tenant (checked by the query).
-- Not once the table has a unique index on the digest (006's, or the
-- primary key 007 makes of it), which serves the same reads.
DO $$
BEGIN
	IF to_regclass('idempotency_requests') IS NOT NULL AND NOT EXISTS (
		SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = to_regclass('idempotency_requests') AND i.indisunique AND i.indnkeyatts = 1
			AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = 'operation_digest'
	) THEN
		CREATE INDEX IF NOT EXISTS idempotency_requests_operation_idx ON idempotency_requests (operation_digest);
	END IF;
END
$$;
