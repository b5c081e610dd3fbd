package postgres_test

import (
	"context"
	"testing"

	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Sweep deletes a record's steps with the record, in the same statement,
// and leaves the steps of the records it keeps; migration 008's down drops
// the steps table and leaves the store's.
func TestSweep_DeletesTheStepsOfSweptRecords(t *testing.T) {
	t.Parallel()
	s := testenv.Postgres(t)
	ctx := context.Background()
	opts := []postgres.Option{postgres.WithSchema(s.Name), postgres.WithTable("idem")}
	if err := postgres.Migrate(ctx, s.Pool, opts...); err != nil {
		t.Fatal(err)
	}
	st, err := postgres.New(s.Pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	// Two finished records with two steps each: "gone" past its retention
	// with a generation below the sweep margin, "kept" within its retention.
	if _, err := s.Pool.Exec(ctx, `
		INSERT INTO `+s.Name+`.idem (tenant_id, operation, key_hash, request_hash, state, generation, owner_token,
			status_code, response_body, response_version, created_at, completed_at, expires_at, retention_us, operation_digest)
		SELECT 't', 'POST /x', sha256(k::bytea), 'fp', 'completed', 1, gen_random_uuid(), 200, '', 1,
			now() - interval '2 days', now() - interval '2 days', now() + e, 1000000, sha256(('d' || k)::bytea)
		FROM (VALUES ('gone', interval '-1 day'), ('kept', interval '1 day')) v(k, e);
		INSERT INTO `+s.Name+`.idem_steps (operation_digest, seq, life, name, state, repeatable, generation, attempts, started_at)
		SELECT r.operation_digest, g, r.created_at, 'step' || g, 'started', false, 1, 1, now()
		FROM `+s.Name+`.idem r, generate_series(0, 1) g`); err != nil {
		t.Fatal(err)
	}
	n, err := st.Sweep(ctx, 100)
	if err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want the 1 record past retention", n, err)
	}
	var gone, kept int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE operation_digest = sha256('dgone'::bytea)),
		count(*) FILTER (WHERE operation_digest = sha256('dkept'::bytea)) FROM `+s.Name+`.idem_steps`).Scan(&gone, &kept); err != nil {
		t.Fatal(err)
	}
	if gone != 0 || kept != 2 {
		t.Fatalf("steps after the sweep: %d of the swept record, %d of the kept one; want 0 and 2", gone, kept)
	}

	if m, err := pgmigrate.Down(ctx, s.Pool, postgres.Migrations(), pgmigrate.Target{Schema: s.Name, Table: "idem"}); err != nil || m.Name != "008_steps" {
		t.Fatalf("down: %+v %v; want 008_steps rolled back", m, err)
	}
	var steps, records bool
	if err := s.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		s.Name+".idem_steps", s.Name+".idem").Scan(&steps, &records); err != nil || steps || !records {
		t.Fatalf("after 008's down: steps table %v, records table %v (%v); want the records' alone", steps, records, err)
	}
}
