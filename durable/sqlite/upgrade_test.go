package sqlite_test

import (
	"database/sql"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/sqlite"
)

// upgrade is the contract suite's Harness.Upgrade: a database file whose
// table was created by 001 and 002 (recorded as applied, as the previous
// release's Migrate left it), rows written with plain SQL, then Migrate.
func upgrade(t testing.TB, refs []durable.Ref) storeapi.Store[*sql.Tx] {
	t.Helper()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	for _, name := range []string{"001_create_idempotency_requests.up.sql", "002_retention_and_binary_headers.up.sql"} {
		b, err := fs.ReadFile(sqlite.Migrations(), name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, string(b)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE oncekey_migration (
	table_name TEXT NOT NULL, version INTEGER NOT NULL, applied_at INTEGER NOT NULL,
	PRIMARY KEY (table_name, version)) STRICT, WITHOUT ROWID;
INSERT INTO oncekey_migration VALUES ('idempotency_requests', 1, 0), ('idempotency_requests', 2, 0)`); err != nil {
		t.Fatal(err)
	}
	for _, ref := range refs {
		if _, err := db.ExecContext(ctx, `INSERT INTO idempotency_requests (tenant_id, operation, key_hash,
	request_hash, state, generation, status_code, response_body, response_version, created_at, completed_at,
	expires_at, retention_us)
VALUES (?1, ?2, ?3, 'v1:fp', 'completed', 1, 201, x'7b7d', 1, unixepoch() * 1000000, unixepoch() * 1000000,
	(unixepoch() + 3600) * 1000000, 3600000000)`, ref.Tenant, ref.Operation, ref.KeyHash[:]); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s := openAt(t, path) // Migrate: 003 and the Go backfill
	return s
}

// TestMigrationDownUp runs 003's down file on a migrated database holding a
// row (as goose would), forgets the version, then Migrate again: the column
// comes back, filled, with the same identity.
func TestMigrationDownUp(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "o.db")
	s := openAt(t, path)
	sc := durable.Scope{Tenant: "t", Operation: "POST /x", Key: "k-down-up"}
	res, err := s.Claim(t.Context(), nil, storeapi.ClaimParams{Scope: sc, Fingerprint: "v1:fp", Owner: [16]byte{1},
		Lease: 60e9, Retention: 3600e9})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %+v %v", res, err)
	}
	s.Close()
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fs.ReadFile(sqlite.Migrations(), "003_operation_digest.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), string(b)+`;
DELETE FROM oncekey_migration WHERE version = 3`); err != nil {
		t.Fatalf("down: %v", err)
	}
	db.Close()
	s = openAt(t, path)
	rec, err := s.Operation(t.Context(), sc.Tenant, res.Ref.Digest())
	if err != nil || rec.Ref != res.Ref {
		t.Fatalf("Operation after down and up: %+v %v", rec.Ref, err)
	}
}
