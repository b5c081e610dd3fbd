-- 004_steps.up.sql
-- Adds idempotency_requests_steps: the recorded steps of a workflow
-- (claim's Lease.Step), one row per step of an operation, keyed by the
-- operation's digest (operation_digest, migration 003) and the step's place
-- in it. A row is started before the step's function runs and finished,
-- with its result, after; both writes are fenced by the lease that holds
-- the record. life is the record's created_at when the step started: a
-- record restarted as a new operation (released, or claimed again past
-- retention) gets a new created_at, strictly above the one before, so the
-- steps of its earlier life no longer count and are replaced as the new
-- life records its own. The sweep deletes a record's steps in the
-- transaction that deletes the record. Times are integer microseconds
-- since the Unix epoch, from the database's clock, as in the records'
-- table; repeatable is 0 or 1.
--
-- A rowid table, unlike the records' WITHOUT ROWID one: a result may be up
-- to 1 MiB, and SQLite keeps large rows better out of the primary key's
-- b-tree. No foreign key: the records' table has no unique key on the
-- digest alone to reference.
--
-- Idempotent: safe to run again on a migrated database.

CREATE TABLE IF NOT EXISTS idempotency_requests_steps (
  operation_digest BLOB    NOT NULL CHECK (length(operation_digest) = 32),
  seq              INTEGER NOT NULL CHECK (seq >= 0),
  life             INTEGER NOT NULL,
  name             TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
  state            TEXT    NOT NULL CHECK (state IN ('started', 'finished', 'uncertain')),
  repeatable       INTEGER NOT NULL CHECK (repeatable IN (0, 1)),
  -- The generation of the lease that last started the step.
  generation       INTEGER NOT NULL CHECK (generation >= 1),
  attempts         INTEGER NOT NULL CHECK (attempts >= 1),
  started_at       INTEGER NOT NULL,
  finished_at      INTEGER,
  -- NULL unless finished; an empty result is an empty BLOB.
  result           BLOB    CHECK (result IS NULL OR length(result) <= 1048576),
  PRIMARY KEY (operation_digest, seq),
  -- A finished step, and only a finished one, has its result and time.
  CHECK ((state = 'finished') = (result IS NOT NULL AND finished_at IS NOT NULL))
) STRICT;
