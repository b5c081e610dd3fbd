-- 003_operation_digest.up.sql
-- Adds operation_digest to idempotency_requests: the 32-byte digest behind
-- the record's operation identity ("op_" + base64url(digest), see
-- durable.Ref.OperationID), so a record can be read by that identity with
-- one indexed read, scoped by tenant_id. Every claim writes it.
--
-- The digest is SHA-256 over the length-prefixed fields "oncekey/ref/v1",
-- tenant_id, operation and key_hash, which SQLite cannot compute in SQL:
-- Store.Migrate fills it for existing rows in the same transaction, right
-- after this file. A database migrated with another tool (goose,
-- golang-migrate) keeps NULL in rows created before 003 until their next
-- claim; they are not found by their operation identity until then.
--
-- Not idempotent: Store.Migrate runs it once (table oncekey_migration).

ALTER TABLE idempotency_requests ADD COLUMN operation_digest BLOB
  CHECK (operation_digest IS NULL OR length(operation_digest) = 32);

CREATE INDEX IF NOT EXISTS idempotency_requests_operation_idx
  ON idempotency_requests (operation_digest);
