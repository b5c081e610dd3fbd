-- 001_create_idempotency_requests.down.sql
-- Drops the table, and the state type unless another table still uses it.
-- Dropping the table deletes every idempotency record: the guarantee ends.

DROP TABLE IF EXISTS idempotency_requests;

DO $$
BEGIN
	DROP TYPE IF EXISTS idempotency_state;
EXCEPTION
	WHEN dependent_objects_still_exist THEN NULL;
END
$$;
