package postgres_test

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
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

// indexesOf lists the table's indexes as "name: definition, primary".
func indexesOf(t *testing.T, f *fixture) map[string]string {
	t.Helper()
	rows, err := f.pool.Query(t.Context(), `SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary
	FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'idempotency_requests'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var name, def string
		var primary bool
		if err := rows.Scan(&name, &def, &primary); err != nil {
			t.Fatal(err)
		}
		if primary {
			def += " PRIMARY"
		}
		got[name] = def
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestMigrateContract runs 007's contract step under a store holding a
// finished and a held record, with the same store instance before and
// after: the digest becomes the primary key, the old key's index and 003's
// go, and the store replays, completes and claims through it unchanged.
// A claim as the version before 006 sends it (ON CONFLICT on the old key's
// columns) then fails, which is why the step is the operator's; Migrate
// does not undo it, and its down file does (the old claim works again).
func TestMigrateContract(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{})
	ctx := t.Context()
	claim := func(key string) storeapi.ClaimResult {
		t.Helper()
		res, err := f.s.Claim(ctx, nil, storeapi.ClaimParams{Scope: durable.Scope{Tenant: "t", Operation: "POST /x", Key: key},
			Fingerprint: "v1:fp", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatalf("claim %s: %v", key, err)
		}
		return res
	}
	done, held := claim("k-done"), claim("k-held")
	if err := f.s.Complete(ctx, nil, done.Ref, done.Token, durable.Result{StatusCode: 201}); err != nil {
		t.Fatal(err)
	}
	// The claim statement of the version before 006, on a fresh key.
	oldClaim := func() error {
		_, err := f.pool.Exec(ctx, `INSERT INTO idempotency_requests (tenant_id, operation, key_hash, request_hash, state,
			generation, owner_token, lease_expires_at, created_at, expires_at, operation_digest)
			VALUES ('t', 'POST /x', sha256(random()::text::bytea), 'v1:fp', 'processing', 1, gen_random_uuid(),
				now() + interval '1 minute', now(), now() + interval '1 hour', sha256(random()::text::bytea))
			ON CONFLICT (tenant_id, operation, key_hash) DO UPDATE SET generation = EXCLUDED.generation`)
		return err
	}
	if err := oldClaim(); err != nil {
		t.Fatalf("the previous version's claim before the contract step: %v", err)
	}
	tg := pgmigrate.Target{Schema: f.schema.Name, Table: pgmigrate.DefaultTable}
	m, err := pgmigrate.Contract(ctx, f.pool, postgres.Migrations(), tg)
	if err != nil || m.Version != 7 {
		t.Fatalf("contract: %+v %v; want version 7", m, err)
	}
	if _, err := pgmigrate.Contract(ctx, f.pool, postgres.Migrations(), tg); !errors.Is(err, pgmigrate.ErrNoContract) {
		t.Fatalf("contract again: %v; want ErrNoContract", err)
	}
	check := func(when string) {
		t.Helper()
		idx := indexesOf(t, f)
		if !strings.HasSuffix(idx["idempotency_requests_pkey"], "(operation_digest) PRIMARY") {
			t.Errorf("%s: primary key %q; want operation_digest", when, idx["idempotency_requests_pkey"])
		}
		for name, def := range idx {
			if strings.Contains(def, "(tenant_id, operation, key_hash)") || name == "idempotency_requests_operation_idx" {
				t.Errorf("%s: %s is still there: %s", when, name, def)
			}
		}
	}
	check("after the contract step")
	if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
		t.Fatal(err)
	}
	check("after Migrate")

	if res := claim("k-done"); res.Acquired || res.Record == nil || res.Record.State != durable.Completed {
		t.Fatalf("replay after the contract step: %+v", res)
	}
	if err := f.s.Complete(ctx, nil, held.Ref, held.Token, durable.Result{StatusCode: 201}); err != nil {
		t.Fatalf("complete a record held across the contract step: %v", err)
	}
	if rec, err := f.s.Operation(ctx, "t", held.Ref.Digest()); err != nil || rec.State != durable.Completed {
		t.Fatalf("Operation: %+v %v", rec, err)
	}
	if res := claim("k-new"); !res.Acquired {
		t.Fatalf("a new key after the contract step: %+v", res)
	}
	var pgErr *pgconn.PgError
	if err := oldClaim(); !errors.As(err, &pgErr) || pgErr.Code != "42P10" {
		t.Fatalf("the previous version's claim after the contract step: %v; want 42P10 (no matching key)", err)
	}

	for m := (pgmigrate.Migration{}); m.Version != 7; { // the later ones first
		if m, err = pgmigrate.Down(ctx, f.pool, postgres.Migrations(), tg); err != nil || m.Version < 7 {
			t.Fatalf("down: %+v %v; want down to 7", m, err)
		}
	}
	idx := indexesOf(t, f)
	if !strings.HasSuffix(idx["idempotency_requests_pkey"], "(tenant_id, operation, key_hash) PRIMARY") || idx["idempotency_requests_operation_idx"] == "" {
		t.Fatalf("after 007's down: %v; want the old primary key and 003's index", idx)
	}
	if err := oldClaim(); err != nil {
		t.Fatalf("the previous version's claim after 007's down: %v", err)
	}
	if res := claim("k-done"); res.Acquired || res.Record == nil {
		t.Fatalf("replay after 007's down: %+v", res)
	}
}

// TestMigrateContractRefusesPartitioned: a table partitioned by the old key
// cannot take the digest as its primary key; the step says so and changes
// nothing.
func TestMigrateContractRefusesPartitioned(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{partitions: 4, opts: []postgres.Option{postgres.WithPartitions(4)}})
	before := indexesOf(t, f)
	_, err := pgmigrate.Contract(t.Context(), f.pool, postgres.Migrations(), pgmigrate.Target{Schema: f.schema.Name, Table: pgmigrate.DefaultTable})
	if err == nil || !strings.Contains(err.Error(), "partitioned") {
		t.Fatalf("contract on a partitioned table: %v; want refused", err)
	}
	if after := indexesOf(t, f); !maps.Equal(before, after) {
		t.Fatalf("indexes changed: %v → %v", before, after)
	}
}

// TestMigrate006 runs Migrate over a table as 006 finds it at its worst: a
// row without its digest (written by an instance older than 003) and the
// primary key constraint under another name. 006 gives the row its digest
// and the constraint the name the claim statement names, so the store
// reads the row, replays it and claims a new key.
func TestMigrate006(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{})
	ctx := t.Context()
	sc := durable.Scope{Tenant: "t", Operation: "POST /x", Key: "k-006"}
	ref, _ := f.s.Ref(sc)
	if _, err := f.pool.Exec(ctx, `INSERT INTO idempotency_requests (tenant_id, operation, key_hash,
	request_hash, state, generation, status_code, response_body, response_version, completed_at, expires_at, retention_us)
VALUES ($1, $2, $3, 'v1:fp', 'completed', 1, 201, '\x7b7d', 1, now(), now() + interval '1 hour', 3600000000)`,
		ref.Tenant, ref.Operation, ref.KeyHash[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `ALTER TABLE idempotency_requests RENAME CONSTRAINT idempotency_requests_pkey TO legacy_pk`); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
		t.Fatal(err)
	}
	if _, ok := indexesOf(t, f)["idempotency_requests_pkey"]; !ok {
		t.Fatalf("after Migrate: %v; want the primary key named idempotency_requests_pkey", indexesOf(t, f))
	}
	rec, err := f.s.Get(ctx, ref)
	if err != nil || rec.State != durable.Completed {
		t.Fatalf("Get of the row 006 gave its digest: %+v %v", rec, err)
	}
	res, err := f.s.Claim(ctx, nil, storeapi.ClaimParams{Scope: sc, Fingerprint: "v1:fp", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Acquired || res.Record == nil {
		t.Fatalf("claim of the completed row: %+v %v; want its replay", res, err)
	}
	sc.Key = "k-006-new"
	if res, err := f.s.Claim(ctx, nil, storeapi.ClaimParams{Scope: sc, Fingerprint: "v1:fp", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour}); err != nil || !res.Acquired {
		t.Fatalf("claim of a new key: %+v %v", res, err)
	}
}

// TestSweepPassesRowsWithoutDigest: a record past retention without its
// digest (an instance older than 003 wrote it after 006 ran), older than
// a swept record, does not stop the sweep: Sweep deletes by the digest, and
// a batch holding the row without one would delete nothing and end the
// sweep. Control: with the sweep's "operation_digest IS NOT NULL" removed,
// Sweep(1) returns 0 here.
func TestSweepPassesRowsWithoutDigest(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{})
	ctx := t.Context()
	insert := func(key string, digest bool, expiredAgo string) {
		t.Helper()
		ref, _ := f.s.Ref(durable.Scope{Tenant: "t", Operation: "POST /x", Key: key})
		var d []byte
		if digest {
			dd := ref.Digest()
			d = dd[:]
		}
		if _, err := f.pool.Exec(ctx, `INSERT INTO idempotency_requests (tenant_id, operation, key_hash, operation_digest,
	request_hash, state, generation, status_code, response_body, response_version, completed_at, expires_at, retention_us)
VALUES ($1, $2, $3, $4, 'v1:fp', 'completed', 1, 201, '\x7b7d', 1, now(), now() - $5::interval, 3600000000)`,
			ref.Tenant, ref.Operation, ref.KeyHash[:], d, expiredAgo); err != nil {
			t.Fatal(err)
		}
	}
	insert("no-digest", false, "2 hours")
	insert("with-digest", true, "1 hour")
	n, err := f.s.Sweep(ctx, 1)
	if err != nil || n != 1 {
		t.Fatalf("Sweep(1) = %d, %v; want the record with its digest deleted, past the older one without", n, err)
	}
	var with, without int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE operation_digest IS NOT NULL),
	count(*) FILTER (WHERE operation_digest IS NULL) FROM idempotency_requests`).Scan(&with, &without); err != nil {
		t.Fatal(err)
	}
	if with != 0 || without != 1 {
		t.Fatalf("rows left: %d with a digest, %d without; want the one without only", with, without)
	}
}
