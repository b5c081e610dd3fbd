-- 007_digest_primary_key.down.sql
-- Undoes the contract step: the primary key is (tenant_id, operation,
-- key_hash) again and 003's index on operation_digest is back, so an
-- instance of a version before 006 can claim again. It builds two indexes
-- while writes wait. A no-op when the primary key is not the digest.

DO $$
BEGIN
	IF NOT EXISTS (
		SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = to_regclass('idempotency_requests') AND i.indisprimary AND i.indnkeyatts = 1
			AND a.attname = 'operation_digest'
	) THEN
		RETURN;
	END IF;
	DROP INDEX IF EXISTS idempotency_requests_scope_key;
	CREATE UNIQUE INDEX idempotency_requests_scope_key ON idempotency_requests (tenant_id, operation, key_hash);
	ALTER TABLE idempotency_requests DROP CONSTRAINT idempotency_requests_pkey;
	ALTER TABLE idempotency_requests ADD CONSTRAINT idempotency_requests_pkey
		PRIMARY KEY USING INDEX idempotency_requests_scope_key;
	CREATE INDEX IF NOT EXISTS idempotency_requests_operation_idx ON idempotency_requests (operation_digest);
	ALTER TABLE idempotency_requests ALTER COLUMN operation_digest DROP NOT NULL;
END
$$;
