-- 006_digest_key.up.sql
-- The expand step of moving the record's key from (tenant_id, operation,
-- key_hash) to operation_digest, the 32-byte digest of those three (003).
-- It changes no index:
--
--   - every row gets its digest (a row inserted by an instance older than
--     003 has none; such instances must not run once 006 is applied);
--   - the primary key constraint gets the name the claim statement names
--     as its conflict target (ON CONFLICT ON CONSTRAINT
--     idempotency_requests_pkey), the name PostgreSQL gave it when 001
--     created the table, should it have another.
--
-- From this version on, every statement names a record by its digest and
-- its scope's columns, and the claim's conflict target is the primary key
-- whatever its columns, so the same statements serve the table before and
-- after 007 (operator-run, "oncekey migrate contract"), which makes the
-- digest the primary key and drops the scope's index: one B-tree fewer
-- for every write, a narrower key for the rest. Instances of the previous
-- version keep working next to this one until 007 is applied.
--
-- Plain SQL: golang-migrate runs it as it is; Store.Migrate runs it on every
-- start (a no-op once every row has its digest).

DO $$
DECLARE
	pk name;
BEGIN
	IF to_regclass('idempotency_requests') IS NULL THEN
		RETURN;
	END IF;
	UPDATE idempotency_requests SET operation_digest = sha256(
		int8send(14::bigint) || convert_to('oncekey/ref/v1', 'UTF8')
		|| int8send(octet_length(convert_to(tenant_id, 'UTF8'))::bigint) || convert_to(tenant_id, 'UTF8')
		|| int8send(octet_length(convert_to(operation, 'UTF8'))::bigint) || convert_to(operation, 'UTF8')
		|| int8send(octet_length(key_hash)::bigint) || key_hash)
	WHERE operation_digest IS NULL;
	SELECT conname INTO pk FROM pg_constraint
	WHERE conrelid = to_regclass('idempotency_requests') AND contype = 'p';
	IF pk IS NOT NULL AND pk <> 'idempotency_requests_pkey' THEN
		EXECUTE format('ALTER TABLE idempotency_requests RENAME CONSTRAINT %I TO idempotency_requests_pkey', pk);
	END IF;
END
$$;
