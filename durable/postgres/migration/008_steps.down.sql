-- 008_steps.down.sql
-- Drops the table 008 added, and with it every recorded step: a workflow
-- resumed afterwards runs its steps again from the first.

DROP TABLE IF EXISTS idempotency_requests_steps;
