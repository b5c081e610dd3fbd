-- 004_stats_indexes.up.sql
-- Adds idempotency_requests_takeovers_idx, a partial index on the records
-- that were ever taken over (takeovers > 0), so that Stats sums takeovers
-- over those records alone instead of reading the whole table. Such records
-- are the exception (a crashed or paused worker, a reconciliation), so the
-- index stays small, and a write that does not change takeovers (a renewal,
-- a completion without takeover) does not touch it.
--
-- Together with the indexes of 001 (pending_idx: processing and uncertain
-- records; sweep_idx: finished and released records by expiry) it serves
-- every exact count of Stats; the completed and failed totals are estimated
-- from the planner's statistics (see the package documentation).
--
-- Plain SQL: golang-migrate runs it as it is; Store.Migrate runs it on every
-- start (a no-op once the index exists). Building it reads the table once
-- while writes to it wait (CREATE INDEX inside the migration's transaction).
-- On a large table, build it beforehand without blocking writes, under the
-- same name, and this migration finds it in place:
--
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_requests_takeovers_idx
--       ON idempotency_requests (takeovers) WHERE takeovers > 0;

CREATE INDEX IF NOT EXISTS idempotency_requests_takeovers_idx ON idempotency_requests (takeovers)
	WHERE takeovers > 0;
