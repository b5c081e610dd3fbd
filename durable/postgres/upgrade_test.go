package postgres_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
)

// upgradeWith returns the contract suite's Harness.Upgrade: a table
// created by the migrations before 003 (WithPartitions(partitions) when it
// is not 0), rows written with plain SQL as the previous release stored
// them, then Migrate.
func upgradeWith(partitions int) func(t testing.TB, refs []durable.Ref) storeapi.Store[pgx.Tx] {
	return func(t testing.TB, refs []durable.Ref) storeapi.Store[pgx.Tx] {
		t.Helper()
		var opts []postgres.Option
		if partitions > 0 {
			opts = append(opts, postgres.WithPartitions(partitions))
		}
		return upgradeFrom(t, refs, partitions, opts)
	}
}

func upgradeFrom(t testing.TB, refs []durable.Ref, partitions int, opts []postgres.Option) storeapi.Store[pgx.Tx] {
	t.Helper()
	f := newFixture(t, fixtureOpts{noMigrate: true, opts: opts})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	files, err := postgres.MigrationsFor(partitions)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"001_create_idempotency_requests.up.sql", "002_retention_and_binary_headers.up.sql"} {
		b, err := fs.ReadFile(files, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.pool.Exec(ctx, string(b)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for _, ref := range refs {
		if _, err := f.pool.Exec(ctx, `INSERT INTO idempotency_requests (tenant_id, operation, key_hash,
	request_hash, state, generation, status_code, response_body, response_version, completed_at, expires_at, retention_us)
VALUES ($1, $2, $3, 'v1:fp', 'completed', 1, 201, '\x7b7d', 1, now(), now() + interval '1 hour', 3600000000)`,
			ref.Tenant, ref.Operation, ref.KeyHash[:]); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency_requests'::regclass
	AND attname = 'operation_digest'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the table before 003 has operation_digest (%d, %v)", n, err)
	}
	if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	// Every pre-existing row got its digest in SQL.
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_requests WHERE operation_digest IS NULL`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows without operation_digest after Migrate (%v)", n, err)
	}
	return f.s
}

// TestMigrationDownUp runs 003's down file on a migrated table holding a
// row, then Migrate again: the column comes back with the same identity.
func TestMigrationDownUp(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{})
	ctx := t.Context()
	sc := durable.Scope{Tenant: "t", Operation: "POST /x", Key: "k-down-up"}
	res, err := f.s.Claim(ctx, nil, storeapi.ClaimParams{Scope: sc, Fingerprint: "v1:fp", Owner: [16]byte{1}, Lease: time.Minute, Retention: time.Hour})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %+v %v", res, err)
	}
	b, err := fs.ReadFile(postgres.Migrations(), "003_operation_digest.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, string(b)); err != nil {
		t.Fatalf("down: %v", err)
	}
	if _, err := f.s.Operation(ctx, sc.Tenant, res.Ref.Digest()); err == nil || strings.Contains(err.Error(), "not found") {
		t.Fatalf("Operation after the down migration = %v; want an error about the missing column", err)
	}
	if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
		t.Fatal(err)
	}
	rec, err := f.s.Operation(ctx, sc.Tenant, res.Ref.Digest())
	if err != nil || rec.Ref != res.Ref {
		t.Fatalf("Operation after down and up: %+v %v", rec.Ref, err)
	}
}

// TestOperationIndex checks that a read by operation digest and tenant can
// use the index 003 creates (sequential scans disabled, as on a large
// table where the planner would never pick one).
func TestOperationIndex(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{})
	tx, err := f.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	var plan strings.Builder
	if _, err := tx.Exec(t.Context(), `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(t.Context(), `EXPLAIN SELECT * FROM idempotency_requests WHERE operation_digest = '\x00'::bytea AND tenant_id = 't'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.String(), "idempotency_requests_operation_idx") {
		t.Fatalf("the operation read does not use its index:\n%s", plan.String())
	}
}
