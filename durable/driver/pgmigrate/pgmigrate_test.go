package pgmigrate_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// withNext returns the store's migrations plus the next numbered pair, the
// way a new pair of files lands in durable/postgres/migration, and its
// version.
func withNext(t *testing.T) (fs.FS, int) {
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
	ms, err := pgmigrate.List(postgres.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	v := ms[len(ms)-1].Version + 1
	name := fmt.Sprintf("%03d_next", v)
	m[name+".up.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE idempotency_requests ADD COLUMN IF NOT EXISTS next_col text;")}
	m[name+".down.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE idempotency_requests DROP COLUMN IF EXISTS next_col;")}
	return m, v
}

func TestNewNumberedPairJustWorks(t *testing.T) {
	s := testenv.Postgres(t)
	ctx := context.Background()
	tg := pgmigrate.Target{Schema: s.Name, Table: "idem"}
	base, err := pgmigrate.List(postgres.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	n := len(base)
	ups := 0 // Up records every version but the contract steps
	for _, m := range base {
		if !m.Contract {
			ups++
		}
	}
	got, err := pgmigrate.Up(ctx, s.Pool, postgres.Migrations(), tg)
	if err != nil || len(got) != ups {
		t.Fatalf("Up = %v, %v; want all %d versions but the contract steps recorded", got, err, ups)
	}
	got, err = pgmigrate.Up(ctx, s.Pool, postgres.Migrations(), tg)
	if err != nil || len(got) != 0 {
		t.Fatalf("Up again = %v, %v; want nothing new", got, err)
	}
	next, v := withNext(t)
	st, err := pgmigrate.Status(ctx, s.Pool, next, tg)
	if err != nil || len(st.Migrations) != n+1 || st.Migrations[n].Applied || !st.Migrations[lastUp(base)].Applied {
		t.Fatalf("Status with the next pair = %+v, %v; want it alone not applied", st, err)
	}
	got, err = pgmigrate.Up(ctx, s.Pool, next, tg)
	if err != nil || len(got) != 1 || got[0] != v {
		t.Fatalf("Up with the next pair = %v, %v; want [%d]", got, err, v)
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
		t.Fatal("the next pair not applied (table name not substituted?)")
	}
	// A build without it sees it as unknown and refuses to roll it back.
	st, err = pgmigrate.Status(ctx, s.Pool, postgres.Migrations(), tg)
	if err != nil || len(st.Unknown) != 1 || st.Unknown[0] != v {
		t.Fatalf("Status of an older build = %+v, %v; want %d unknown", st, err, v)
	}
	if _, err := pgmigrate.Down(ctx, s.Pool, postgres.Migrations(), tg); err == nil {
		t.Fatal("an older build rolled back a version it does not have")
	}
	m, err := pgmigrate.Down(ctx, s.Pool, next, tg)
	if err != nil || m.Version != v || col() {
		t.Fatalf("Down = %+v, %v (column still there: %v); want %d rolled back", m, err, col(), v)
	}
	if st, _ := pgmigrate.Status(ctx, s.Pool, next, tg); !st.Migrations[lastUp(base)].Applied || st.Migrations[n].Applied {
		t.Fatalf("after Down: %+v; want all but the last applied", st)
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

// lastUp is the index in ms of the last migration Up applies (not a
// contract step).
func lastUp(ms []pgmigrate.Migration) int {
	for i := len(ms) - 1; i >= 0; i-- {
		if !ms[i].Contract {
			return i
		}
	}
	return -1
}

// TestContractOrder: Contract refuses a schema Up has not migrated, applies
// the contract steps after Up (which leaves them out), then has none left;
// Down rolls the contract step back first.
func TestContractOrder(t *testing.T) {
	s := testenv.Postgres(t)
	ctx := context.Background()
	tg := pgmigrate.Target{Schema: s.Name, Table: "idem"}
	if _, err := pgmigrate.Contract(ctx, s.Pool, postgres.Migrations(), tg); err == nil || !strings.Contains(err.Error(), "run up first") {
		t.Fatalf("Contract before Up: %v; want refused", err)
	}
	if _, err := pgmigrate.Up(ctx, s.Pool, postgres.Migrations(), tg); err != nil {
		t.Fatal(err)
	}
	m, err := pgmigrate.Contract(ctx, s.Pool, postgres.Migrations(), tg)
	if err != nil || !m.Contract {
		t.Fatalf("Contract after Up = %+v, %v; want a contract step applied", m, err)
	}
	if _, err := pgmigrate.Contract(ctx, s.Pool, postgres.Migrations(), tg); !errors.Is(err, pgmigrate.ErrNoContract) {
		t.Fatalf("Contract again: %v; want ErrNoContract", err)
	}
	// Down rolls back the highest recorded version first: the up steps
	// numbered after the contract step (008 after 007), then the contract
	// step itself.
	for d := (pgmigrate.Migration{}); d.Version != m.Version; {
		if d, err = pgmigrate.Down(ctx, s.Pool, postgres.Migrations(), tg); err != nil || d.Version < m.Version {
			t.Fatalf("Down = %+v, %v; want the versions above the contract step %d, then it", d, err, m.Version)
		}
	}
}
