-- 005_resolutions.up.sql
-- Adds idempotency_requests_resolutions: the record of each operator
-- resolution (cmd/oncekey resolve), written in the transaction that stores
-- the resolved result, so both commit or neither does. A row names the
-- operation by its identity (operation_id, "op_..."; the tenant and key hash
-- stay in idempotency_requests only), the generation resolve adopted it
-- under, the state and status it stored, the operator's reason and who
-- resolved it. The library itself never reads or writes it.
--
-- Before this migration, resolve created the table on first use with these
-- same columns: this finds such a table in place.
--
-- Plain SQL: golang-migrate runs it as it is; Store.Migrate runs it on every
-- start (a no-op once the table exists).

CREATE TABLE IF NOT EXISTS idempotency_requests_resolutions (
	operation_id text        NOT NULL,
	operation    text        NOT NULL,
	generation   bigint      NOT NULL,
	state        text        NOT NULL,
	status_code  integer     NOT NULL,
	reason       text        NOT NULL,
	operator     text        NOT NULL,
	resolved_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
	PRIMARY KEY (operation_id, generation)
);
