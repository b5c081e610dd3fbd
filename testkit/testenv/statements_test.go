package testenv_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/testkit/testenv"
)

// A StatementCounter counts one per statement sent on its own and one per
// batch; Skip leaves out the statements sent on their own it matches, never
// a batch. The control: the same statements on a counter without Skip.
func TestStatementCounter_CountsRoundTrips(t *testing.T) {
	t.Parallel()
	s := testenv.Postgres(t)
	skipSelect2 := func(sql string) bool { return strings.HasPrefix(sql, "select 2") }
	for _, tc := range []struct {
		name string
		c    *testenv.StatementCounter
		want int64
	}{
		{"All", &testenv.StatementCounter{}, 4},
		{"Skip", &testenv.StatementCounter{Skip: skipSelect2}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(s.URL)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.Tracer = tc.c
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			tc.c.Reset()
			for _, sql := range []string{"select 1", "select 2", "select 3"} {
				if _, err := pool.Exec(t.Context(), sql); err != nil {
					t.Fatal(err)
				}
			}
			b := &pgx.Batch{}
			b.Queue("select 2")
			b.Queue("select 4")
			if err := pool.SendBatch(t.Context(), b).Close(); err != nil {
				t.Fatal(err)
			}
			if n := tc.c.Count(); n != tc.want {
				t.Fatalf("counted %d statements, want %d", n, tc.want)
			}
			tc.c.Reset()
			if n := tc.c.Count(); n != 0 {
				t.Fatalf("after Reset: %d, want 0", n)
			}
		})
	}
}
