-- brin_churn.sql: does a BRIN index on the expiry serve the sweep once the
-- table churns? (issue 30.4; the answer in bench/README.md: no.)
--
--   psql "$DATABASE_URL" -f bench/experiments/brin_churn.sql
--
-- Makes schema brinx (dropped first), with two copies of a record-like
-- table (fillfactor 80, ~300 bytes a row): rec with a BRIN index on
-- expires_at, recb with the partial B-tree the library's sweep uses. It
-- inserts 1 M rows one millisecond apart with a day's retention, then ten
-- times deletes the 100 k oldest, VACUUMs (the space becomes reusable) and
-- inserts 100 k new rows, and finally EXPLAINs the sweep's query (finished
-- rows past expiry, oldest first, LIMIT 1000) on both: compare the
-- "Buffers" lines. Run it with nothing holding an old snapshot (a long
-- transaction keeps VACUUM from removing the deleted rows and spoils both
-- figures). About 30 s and 1 GB; DROP SCHEMA brinx CASCADE afterwards.
\set ON_ERROR_STOP on
drop schema if exists brinx cascade;
create schema brinx;
create table brinx.rec (id bigint primary key, state "char" not null, pad bytea, created_at timestamptz not null, expires_at timestamptz not null) with (fillfactor = 80);
create index rec_brin on brinx.rec using brin (expires_at);
create table brinx.recb (like brinx.rec including all) with (fillfactor = 80);
drop index if exists brinx.recb_expires_at_idx;
create index recb_bt on brinx.recb (expires_at) where state in ('c','f');
-- 1M records, one per ms, one day of retention; padding to ~300 bytes like a record
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1, 1000000) g;
insert into brinx.recb select * from brinx.rec;
vacuum analyze brinx.rec; vacuum analyze brinx.recb;
-- churn: 10 cycles of expiring the oldest 100k and inserting 100k new ones
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 100000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 100000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1000001, 1100000) g;
insert into brinx.recb select * from brinx.rec where id > 1000000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 200000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 200000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1100001, 1200000) g;
insert into brinx.recb select * from brinx.rec where id > 1100000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 300000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 300000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1200001, 1300000) g;
insert into brinx.recb select * from brinx.rec where id > 1200000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 400000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 400000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1300001, 1400000) g;
insert into brinx.recb select * from brinx.rec where id > 1300000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 500000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 500000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1400001, 1500000) g;
insert into brinx.recb select * from brinx.rec where id > 1400000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 600000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 600000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1500001, 1600000) g;
insert into brinx.recb select * from brinx.rec where id > 1500000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 700000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 700000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1600001, 1700000) g;
insert into brinx.recb select * from brinx.rec where id > 1600000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 800000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 800000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1700001, 1800000) g;
insert into brinx.recb select * from brinx.rec where id > 1700000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 900000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 900000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1800001, 1900000) g;
insert into brinx.recb select * from brinx.rec where id > 1800000;
delete from brinx.rec where expires_at <= timestamptz '2026-01-02' + 1000000 * interval '1 ms';
delete from brinx.recb where expires_at <= timestamptz '2026-01-02' + 1000000 * interval '1 ms';
vacuum brinx.rec; vacuum brinx.recb;
insert into brinx.rec select g, 'c', convert_to(repeat('x', 250), 'UTF8'), timestamptz '2026-01-01' + g * interval '1 ms', timestamptz '2026-01-02' + g * interval '1 ms' from generate_series(1900001, 2000000) g;
insert into brinx.recb select * from brinx.rec where id > 1900000;
vacuum analyze brinx.rec; vacuum analyze brinx.recb;
select pg_relation_size('brinx.rec')/8192 as rec_pages, pg_relation_size('brinx.recb')/8192 as recb_pages;
explain (analyze, buffers, costs off) select id from brinx.rec where state in ('c','f') and expires_at <= timestamptz '2026-01-02' + 1101000 * interval '1 ms' order by expires_at limit 1000;
explain (analyze, buffers, costs off) select id from brinx.recb where state in ('c','f') and expires_at <= timestamptz '2026-01-02' + 1101000 * interval '1 ms' order by expires_at limit 1000;
