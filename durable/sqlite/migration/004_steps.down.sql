-- 004_steps.down.sql
-- Drops the table 004 added, and with it every recorded step: a workflow
-- resumed afterwards runs its steps again from the first. Idempotent.

DROP TABLE IF EXISTS idempotency_requests_steps;
