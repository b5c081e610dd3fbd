package sqlite

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestQueryPlans checks that Sweep and Pending read their partial indexes,
// Operation its index, and the step statements the steps' primary key,
// instead of the whole table.
func TestQueryPlans(t *testing.T) {
	s, err := OpenStore(t.Context(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		query, index string
		args         []any
	}{
		"sweep":   {s.q.sweep, "idempotency_requests_sweep_idx", []any{10}},
		"pending": {s.q.pending, "idempotency_requests_pending_idx", []any{0, 10}},
		// The operation resource: one indexed read by digest.
		"operation": {s.q.operation, "idempotency_requests_operation_idx", []any{make([]byte, 32), "t"}},
		// The steps of a record, and of a swept one: by the steps' primary
		// key (operation_digest, seq), whose index SQLite names itself.
		"sweep steps": {s.q.sweepSteps, "sqlite_autoindex_idempotency_requests_steps_1", []any{make([]byte, 32)}},
		"steps": {s.q.steps.list, "sqlite_autoindex_idempotency_requests_steps_1",
			[]any{"t", "op", make([]byte, 32), make([]byte, 32), true}},
		"finish step": {s.q.steps.finish, "sqlite_autoindex_idempotency_requests_steps_1",
			[]any{"t", "op", make([]byte, 32), "owner", 1, make([]byte, 32), 0, []byte{}}},
	} {
		rows, err := s.db.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+tc.query, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if !strings.Contains(strings.Join(plan, "\n"), tc.index) {
			t.Errorf("%s does not use %s:\n%s", name, tc.index, strings.Join(plan, "\n"))
		}
		t.Logf("%s:\n%s", name, strings.Join(plan, "\n"))
	}
}

// TestMigrationDown checks that the down migration undoes the up one and
// that both are idempotent. The up migrations create the table, its three
// indexes and the steps table (004; its primary key's index is SQLite's
// sqlite_autoindex_custom_requests_steps_1).
func TestMigrationDown(t *testing.T) {
	s, err := OpenStore(t.Context(), filepath.Join(t.TempDir(), "down.db"), WithTable("custom_requests"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	objects := func() int {
		var n int
		if err := s.db.QueryRowContext(t.Context(), `SELECT count(*) FROM sqlite_schema WHERE name LIKE 'custom_requests%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, step := range []struct {
		suffix string
		want   int
	}{{".up.sql", 5}, {".up.sql", 5}, {".down.sql", 0}, {".down.sql", 0}, {".up.sql", 5}} {
		if err := s.migrate(t.Context(), step.suffix); err != nil {
			t.Fatalf("%s: %v", step.suffix, err)
		}
		if n := objects(); n != step.want {
			t.Fatalf("after %s: %d schema objects, want %d", step.suffix, n, step.want)
		}
		var cols int
		if err := s.db.QueryRowContext(t.Context(), `SELECT count(*) FROM pragma_table_info('custom_requests')
			WHERE name IN ('retention_us', 'response_headers_bin', 'operation_digest')`).Scan(&cols); err != nil {
			t.Fatal(err)
		}
		if want := map[int]int{5: 3, 0: 0}[step.want]; cols != want {
			t.Fatalf("after %s: %d of the columns of 002 and 003, want %d", step.suffix, cols, want)
		}
	}
}
