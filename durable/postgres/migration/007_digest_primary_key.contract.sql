-- 007_digest_primary_key.contract.sql
-- The contract step of 006: makes operation_digest the primary key and
-- drops the indexes it replaces, the old primary key's on (tenant_id,
-- operation, key_hash) and 003's idempotency_requests_operation_idx. Every
-- write then maintains one B-tree fewer, and the key it does maintain is
-- 32 bytes instead of the tenant, the operation and the key hash.
--
-- Migrate never runs it (nor does golang-migrate: the name is not an up
-- file). Run it once every instance runs a version with 006 (0.x.y or later,
-- see CHANGELOG.md): an instance of an earlier version claims with ON
-- CONFLICT (tenant_id, operation, key_hash), which fails on the table
-- afterwards. "oncekey migrate contract" runs it under Migrate's lock and
-- records version 7; with another tool, run this file as it is, in one
-- transaction.
--
-- It reads the table twice (SET NOT NULL, the unique index build) while
-- writes to it wait: on a large table, run it at a quiet time. It is
-- refused for a hash-partitioned table (WithPartitions), which is
-- partitioned by the old key and cannot have a primary key without it.
-- Running it again is a no-op.

DO $$
BEGIN
	IF to_regclass('idempotency_requests') IS NULL THEN
		RAISE EXCEPTION 'idempotency_requests does not exist: run migrate up first';
	END IF;
	IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('idempotency_requests')) <> 'r' THEN
		RAISE EXCEPTION 'idempotency_requests is partitioned by (tenant_id, operation, key_hash): its primary key cannot leave them out';
	END IF;
	IF EXISTS (
		SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = to_regclass('idempotency_requests') AND i.indisprimary AND i.indnkeyatts = 1
			AND a.attname = 'operation_digest'
	) THEN
		RETURN; -- applied
	END IF;
	IF EXISTS (SELECT 1 FROM idempotency_requests WHERE operation_digest IS NULL) THEN
		RAISE EXCEPTION 'idempotency_requests has rows without operation_digest: run migrate up (006) first';
	END IF;
	ALTER TABLE idempotency_requests ALTER COLUMN operation_digest SET NOT NULL;
	DROP INDEX IF EXISTS idempotency_requests_digest_key;
	CREATE UNIQUE INDEX idempotency_requests_digest_key ON idempotency_requests (operation_digest);
	ALTER TABLE idempotency_requests DROP CONSTRAINT idempotency_requests_pkey;
	ALTER TABLE idempotency_requests ADD CONSTRAINT idempotency_requests_pkey
		PRIMARY KEY USING INDEX idempotency_requests_digest_key;
	DROP INDEX IF EXISTS idempotency_requests_operation_idx;
END
$$;
