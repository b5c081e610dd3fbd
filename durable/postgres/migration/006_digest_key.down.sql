-- 006_digest_key.down.sql
-- Nothing to undo: 006 filled in digests (which the previous version
-- writes too) and, at most, renamed the primary key constraint to the name
-- PostgreSQL gives it. Refused while 007's contract step is applied (the
-- primary key is then the digest, on which the previous version cannot
-- claim): roll 007 back first.

DO $$
BEGIN
	IF EXISTS (
		SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = to_regclass('idempotency_requests') AND i.indisprimary AND i.indnkeyatts = 1
			AND a.attname = 'operation_digest'
	) THEN
		RAISE EXCEPTION 'idempotency_requests has operation_digest as its primary key (007): roll 007 back first';
	END IF;
END
$$;
