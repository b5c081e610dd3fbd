#!/usr/bin/env bash
# hot_completion.sh: what a HOT workflow completion would save (issue 44,
# decision 2; the answer in bench/README.md, "Decision 2").
#
#   bash bench/experiments/hot_completion.sh [seconds per run] [rounds]
#
# A workflow writes its record twice: the claim INSERTs it processing, the
# completion UPDATEs it to completed (state, expiry, result). On PostgreSQL
# 15 an UPDATE is HOT (no new index entries) only when no indexed column
# changes, predicate columns included, and the page has room. Makes schema
# hotx (dropped first) with two copies of the record after migration 007:
#   now: the library's indexes (primary key on the digest; sweep on the
#        expiry where finished or released; pending on created_at where
#        processing or uncertain; takeovers where > 0), fillfactor 100;
#   hot: the primary key alone, fillfactor 80: every completion can be HOT,
#        and Pending and the sweep scan the table (the upper bound of the gain).
# pgbench (16 clients, prepared) runs claim + completion against each,
# alternating, and prints tps and the share of HOT updates. DROP SCHEMA hotx
# CASCADE afterwards (the script does it at the end).
set -euo pipefail
secs=${1:-8}
rounds=${2:-3}
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

psql -q -v ON_ERROR_STOP=1 "$url" <<'SQL'
drop schema if exists hotx cascade;
create schema hotx;
create type hotx.st as enum ('processing', 'completed', 'failed', 'uncertain');
create table hotx.now (
	operation_digest bytea primary key, tenant_id text not null, operation text not null,
	key_hash bytea not null, request_hash text not null, state hotx.st not null,
	generation bigint not null, owner_token uuid, lease_expires_at timestamptz,
	status_code integer, response_headers jsonb, response_headers_bin bytea,
	response_body bytea, response_version integer, resource_id text,
	takeovers integer not null default 0, created_at timestamptz not null default now(),
	completed_at timestamptz, expires_at timestamptz not null, retention_us bigint);
create table hotx.hot (like hotx.now including defaults) with (fillfactor = 80);
alter table hotx.hot add primary key (operation_digest);
create index now_sweep on hotx.now (expires_at)
	where state in ('completed', 'failed') or (state = 'processing' and owner_token is null);
create index now_pending on hotx.now (created_at) where state in ('processing', 'uncertain');
create index now_takeovers on hotx.now (takeovers) where takeovers > 0;
SQL

for t in now hot; do
	cat >"$tmp/$t.sql" <<EOF
\set k random(1, 1000000000000)
BEGIN;
INSERT INTO hotx.$t (operation_digest, tenant_id, operation, key_hash, request_hash, state, generation,
	owner_token, lease_expires_at, expires_at, retention_us)
VALUES (sha256(int8send(:k::bigint)), 't', 'pay', sha256(int8send(-(:k::bigint))), 'fp-0123456789abcdef', 'processing', 1,
	'00000000-0000-0000-0000-000000000001', clock_timestamp() + interval '30 s',
	clock_timestamp() + interval '1 day', 86400000000) ON CONFLICT DO NOTHING;
COMMIT;
BEGIN;
UPDATE hotx.$t SET state = 'completed', status_code = 200, response_body = '\x7b226f6b223a747275657d',
	response_version = 1, completed_at = clock_timestamp(), lease_expires_at = NULL,
	expires_at = clock_timestamp() + interval '1 day'
WHERE operation_digest = sha256(int8send(:k::bigint)) AND generation = 1
	AND owner_token = '00000000-0000-0000-0000-000000000001' AND state = 'processing';
COMMIT;
EOF
done

echo "load: $(cat /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
	for t in now hot; do
		tps=$(pgbench -n -M prepared -c 16 -j 2 -T "$secs" -f "$tmp/$t.sql" "$url" 2>"$tmp/err" |
			awk "/^tps/ {print \$3; exit}") || { cat "$tmp/err" >&2; exit 1; }
		echo "round $r $t tps=$tps"
	done
done
psql -qAt "$url" -c "select relname || ': updates ' || n_tup_upd || ', hot ' || n_tup_hot_upd
	|| ' (' || round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1), 1) || '%)'
	from pg_stat_user_tables where schemaname = 'hotx' order by relname"
echo "load: $(cat /proc/loadavg)"
psql -q "$url" -c 'drop schema hotx cascade'
