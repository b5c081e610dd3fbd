-- 008_steps.up.sql
-- Adds idempotency_requests_steps: the recorded steps of a workflow
-- (claim's Lease.Step), one row per step of an operation. A row is started
-- before the step's function runs and finished, with its result, after;
-- both writes are fenced by the lease that holds the record. life is the
-- record's created_at when the step started: a record restarted as a new
-- operation (released, or claimed again past retention) gets a new
-- created_at, so the steps of its earlier life no longer count and are
-- replaced as the new life records its own. The sweep deletes a record's
-- steps in the statement that deletes the record.
--
-- No foreign key: a table hash-partitioned on the scope (WithPartitions)
-- has no unique index on the digest alone to reference.
--
-- Plain SQL: golang-migrate runs it as it is; Store.Migrate runs it on every
-- start (a no-op once the table exists).

CREATE TABLE IF NOT EXISTS idempotency_requests_steps (
	operation_digest bytea       NOT NULL,
	seq              integer     NOT NULL,
	life             timestamptz NOT NULL,
	name             text        NOT NULL,
	state            text        NOT NULL,
	repeatable       boolean     NOT NULL,
	generation       bigint      NOT NULL,
	attempts         integer     NOT NULL,
	started_at       timestamptz NOT NULL,
	finished_at      timestamptz,
	result           bytea,
	PRIMARY KEY (operation_digest, seq),
	CONSTRAINT idempotency_requests_steps_state CHECK (state IN ('started', 'finished', 'uncertain')),
	CONSTRAINT idempotency_requests_steps_result_len CHECK (octet_length(result) <= 1048576)
);
