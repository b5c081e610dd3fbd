-- 004_stats_indexes.down.sql
-- Drops the index 004 added. Stats then sums takeovers by reading the table.

DROP INDEX IF EXISTS idempotency_requests_takeovers_idx;
