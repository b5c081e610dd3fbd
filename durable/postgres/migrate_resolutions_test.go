package postgres_test

import (
	"context"
	"slices"
	"testing"

	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Migration 005 creates <table>_resolutions (what cmd/oncekey resolve
// writes the operator's reason to) under the configured schema and table
// name; a table resolve created itself before 005 is found in place with
// its rows; 005's down drops it and leaves the store's table.
func TestMigrate_005Resolutions(t *testing.T) {
	t.Parallel()
	s := testenv.Postgres(t)
	ctx := context.Background()
	res := s.Name + ".idem_resolutions"
	exists := func(name string) bool {
		t.Helper()
		var ok bool
		if err := s.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	// What resolve created on first use before 005, with a row.
	if _, err := s.Pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s.Name+`; CREATE TABLE `+res+` (
		operation_id text        NOT NULL,
		operation    text        NOT NULL,
		generation   bigint      NOT NULL,
		state        text        NOT NULL,
		status_code  integer     NOT NULL,
		reason       text        NOT NULL,
		operator     text        NOT NULL,
		resolved_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
		PRIMARY KEY (operation_id, generation)
	); INSERT INTO `+res+` VALUES ('op_old', 'POST /x', 3, 'failed', 402, 'declined', 'ana')`); err != nil {
		t.Fatal(err)
	}
	opts := []postgres.Option{postgres.WithSchema(s.Name), postgres.WithTable("idem")}
	if err := postgres.Migrate(ctx, s.Pool, opts...); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM `+res).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows of the resolutions table resolve created: %d %v; want the 1 kept", n, err)
	}
	// The columns resolve inserts, under a second generation.
	if _, err := s.Pool.Exec(ctx, `INSERT INTO `+res+` (operation_id, operation, generation, state, status_code, reason, operator)
		VALUES ('op_old', 'POST /x', 4, 'completed', 201, 'captured', 'bo')`); err != nil {
		t.Fatalf("insert as resolve does: %v", err)
	}
	ms, err := pgmigrate.List(postgres.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ms, func(m pgmigrate.Migration) bool { return m.Name == "005_resolutions" }) {
		t.Fatal("no migration 005_resolutions; this test rolls it back")
	}
	var m pgmigrate.Migration
	for m.Version != 5 { // the later ones first
		if m, err = pgmigrate.Down(ctx, s.Pool, postgres.Migrations(), pgmigrate.Target{Schema: s.Name, Table: "idem"}); err != nil || m.Version < 5 {
			t.Fatalf("down: %+v %v; want down to version 5", m, err)
		}
	}
	if exists(res) || !exists(s.Name+".idem") {
		t.Fatalf("after 005's down: resolutions %v, store's table %v; want only the store's table", exists(res), exists(s.Name+".idem"))
	}
	// A fresh schema gets it from Migrate alone.
	s2 := testenv.Postgres(t)
	if err := postgres.Migrate(ctx, s2.Pool, postgres.WithSchema(s2.Name)); err != nil {
		t.Fatal(err)
	}
	if !exists(s2.Name + ".idempotency_requests_resolutions") {
		t.Fatal("Migrate did not create idempotency_requests_resolutions")
	}
}
