package pgmigrate_test

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/internal/pgmigrate"
	"github.com/oncekey/oncekey/internal/testenv"
)

// withNext returns the store's migrations plus a 003 pair, the way a new
// numbered pair of files lands in durable/postgres/migration.
func withNext(t *testing.T) fs.FS {
	m := fstest.MapFS{}
	err := fs.WalkDir(postgres.Migrations(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(postgres.Migrations(), p)
		m[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	m["003_next.up.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE idempotency_requests ADD COLUMN IF NOT EXISTS next_col text;")}
	m["003_next.down.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE idempotency_requests DROP COLUMN IF EXISTS next_col;")}
	return m
}

func TestNewNumberedPairJustWorks(t *testing.T) {
	s := testenv.Postgres(t)
	ctx := context.Background()
	tg := pgmigrate.Target{Schema: s.Name, Table: "idem"}
	got, err := pgmigrate.Up(ctx, s.Pool, postgres.Migrations(), tg)
	if err != nil || len(got) != 2 {
		t.Fatalf("Up = %v, %v; want versions 1 and 2 recorded", got, err)
	}
	got, err = pgmigrate.Up(ctx, s.Pool, postgres.Migrations(), tg)
	if err != nil || len(got) != 0 {
		t.Fatalf("Up again = %v, %v; want nothing new", got, err)
	}
	next := withNext(t)
	st, err := pgmigrate.Status(ctx, s.Pool, next, tg)
	if err != nil || len(st.Migrations) != 3 || st.Migrations[2].Applied {
		t.Fatalf("Status with 003 = %+v, %v; want 003 not applied", st, err)
	}
	got, err = pgmigrate.Up(ctx, s.Pool, next, tg)
	if err != nil || len(got) != 1 || got[0] != 3 {
		t.Fatalf("Up with 003 = %v, %v; want [3]", got, err)
	}
	col := func() bool {
		var ok bool
		if err := s.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
			WHERE table_schema = $1 AND table_name = 'idem' AND column_name = 'next_col')`, s.Name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !col() {
		t.Fatal("003 not applied (table name not substituted?)")
	}
	// A build without 003 sees it as unknown and refuses to roll it back.
	st, err = pgmigrate.Status(ctx, s.Pool, postgres.Migrations(), tg)
	if err != nil || len(st.Unknown) != 1 || st.Unknown[0] != 3 {
		t.Fatalf("Status of an older build = %+v, %v; want 3 unknown", st, err)
	}
	if _, err := pgmigrate.Down(ctx, s.Pool, postgres.Migrations(), tg); err == nil {
		t.Fatal("an older build rolled back a version it does not have")
	}
	m, err := pgmigrate.Down(ctx, s.Pool, next, tg)
	if err != nil || m.Version != 3 || col() {
		t.Fatalf("Down = %+v, %v (column still there: %v); want 003 rolled back", m, err, col())
	}
	if st, _ := pgmigrate.Status(ctx, s.Pool, next, tg); !st.Migrations[1].Applied || st.Migrations[2].Applied {
		t.Fatalf("after Down: %+v; want 001 and 002 applied, 003 not", st)
	}
}

func TestListRejectsBadNames(t *testing.T) {
	for name, m := range map[string]fstest.MapFS{
		"no number": {"x.up.sql": {}, "x.down.sql": {}},
		"no down":   {"001_a.up.sql": {}},
		"twice":     {"001_a.up.sql": {}, "001_a.down.sql": {}, "1_b.up.sql": {}, "1_b.down.sql": {}},
	} {
		if _, err := pgmigrate.List(m); err == nil {
			t.Errorf("%s: List accepted it", name)
		}
	}
	if _, err := pgmigrate.Down(context.Background(), testenv.Postgres(t).Pool, fstest.MapFS{}, pgmigrate.Target{Table: "idem"}); !errors.Is(err, pgmigrate.ErrNothingToRollBack) {
		t.Errorf("Down on an empty schema: %v", err)
	}
}
