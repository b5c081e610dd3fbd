package postgres

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/durable"
)

// statsRows is the size at which the Stats tests look at plans: large
// enough that a sequential scan is what the planner picks for a statement
// that has no index to use (the negative control shows it does).
const statsRows = 50_000

// TestStatsAtScale seeds statsRows records, runs ANALYZE, and checks that
//
//   - every part of the Stats statement reads an index of the table, never a
//     sequential scan of it (and that the previous full-count statement,
//     EXPLAINed at the same size, is reported as a Seq Scan by the same
//     check: the check can fail);
//   - Stats takes that statement alone (the table is above
//     statsExactMaxPages, so it does not count everything);
//   - the counts that must be exact are, against count(*), and the
//     completed and failed estimates are within 10 % of count(*).
func TestStatsAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 50,000 records")
	}
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"plain", nil},
		{"partitioned", []Option{WithPartitions(4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newInternalStore(t, tc.opts...)
			want := seed(t, s.pool, s.table, statsRows)
			checkStatsAtScale(t, s, want)
		})
	}
}

func checkStatsAtScale(t *testing.T, s *internalStore, want seedMix) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	parent, leaves, err := tableRelations(ctx, s.pool, s.table)
	if err != nil {
		t.Fatal(err)
	}
	rels := append([]string{parent}, leaves...)

	plan, raw, err := explain(ctx, s.pool, s.q.stats)
	if err != nil {
		t.Fatal(err)
	}
	a := accessOf(plan, rels)
	if len(a.seqScans) > 0 {
		t.Errorf("Stats reads %v with a Seq Scan at %d rows:\n%s", a.seqScans, statsRows, raw)
	}
	// The four parts each read their index (in every partition).
	for _, idx := range []string{"pending", "sweep", "takeovers"} {
		n := 0
		for _, got := range a.indexes {
			if containsIndexOf(got, idx, s.store.cfg.table) {
				n++
			}
		}
		wantN := len(leaves)
		if idx == "sweep" {
			wantN *= 2 // the backlog count and the oldest finished record
		}
		if n < wantN {
			t.Errorf("Stats reads the %s index %d times, want %d (indexes read: %v):\n%s", idx, n, wantN, a.indexes, raw)
		}
	}
	// Negative control: the full count, at the same size, is a Seq Scan.
	plan, raw, err = explain(ctx, s.pool, s.q.statsExact)
	if err != nil {
		t.Fatal(err)
	}
	if a := accessOf(plan, rels); len(a.seqScans) == 0 {
		t.Errorf("the check does not see the full count's Seq Scan:\n%s", raw)
	}

	s.rec.reset()
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.rec.ran(s.q.statsExact) || !s.rec.ran(s.q.stats) {
		t.Fatalf("Stats at %d rows ran the full count (or not the indexed statement): %q", statsRows, s.rec.sql)
	}
	exact := []struct {
		name      string
		got, want int64
	}{
		{"ByState[processing]", st.ByState[durable.Processing], want.leased},
		{"ByState[uncertain]", st.ByState[durable.Uncertain], want.uncertain},
		{"Released", st.Released, want.released},
		{"StaleProcessing", st.StaleProcessing, want.stale},
		{"ExpiredStuck", st.ExpiredStuck, want.stuck},
		{"ExpiredUnswept", st.ExpiredUnswept, want.unswept},
		{"Takeovers", st.Takeovers, want.takeovers},
	}
	for _, e := range exact {
		if e.got != e.want {
			t.Errorf("%s = %d; count(*) says %d", e.name, e.got, e.want)
		}
	}
	for _, e := range []struct {
		name      string
		got, want int64
	}{
		{"ByState[completed]", st.ByState[durable.Completed], want.completed},
		{"ByState[failed]", st.ByState[durable.Failed], want.failed},
	} {
		if math.Abs(float64(e.got-e.want)) > 0.1*float64(e.want) {
			t.Errorf("%s = %d, an estimate more than 10%% off count(*) = %d", e.name, e.got, e.want)
		}
	}
	// The oldest unexpired record: the seed gives every record one
	// retention, so the one whose retention ends first is the oldest.
	var oldest time.Duration
	if err := s.pool.QueryRow(ctx, `SELECT (EXTRACT(EPOCH FROM now() - min(created_at)) * 1e6)::bigint * interval '1 microsecond'
		FROM `+s.table+` WHERE expires_at > now()`).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	if d := st.OldestUnexpiredAge - oldest; d < -time.Second || d > 30*time.Second {
		t.Errorf("OldestUnexpiredAge = %v; the oldest unexpired record is %v old", st.OldestUnexpiredAge, oldest)
	}
	t.Logf("Stats at %d rows: %+v (exact completed %d, failed %d)", statsRows, st, want.completed, want.failed)
}

// containsIndexOf reports whether the index name got is the store's index
// kind (pending, sweep, takeovers) on table, or its copy on a partition
// (named by PostgreSQL after the partition and the indexed column).
func containsIndexOf(got, kind, table string) bool {
	if got == table+"_"+kind+"_idx" {
		return true
	}
	col := map[string]string{"pending": "created_at", "sweep": "expires_at", "takeovers": "takeovers"}[kind]
	return strings.HasPrefix(got, table+"_p") && strings.HasSuffix(got, "_"+col+"_idx")
}

// TestStatsExactOnSmallTable runs the same mix at a small size: the table
// is within statsExactMaxPages, so Stats counts everything exactly, the
// estimated totals included.
func TestStatsExactOnSmallTable(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	want := seed(t, s.pool, s.table, 2000)
	ctx := t.Context()
	s.rec.reset()
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !s.rec.ran(s.q.statsExact) {
		t.Fatal("Stats on a small table did not count exactly")
	}
	if st.ByState[durable.Completed] != want.completed || st.ByState[durable.Failed] != want.failed ||
		st.ByState[durable.Processing] != want.leased || st.ExpiredUnswept != want.unswept || st.Takeovers != want.takeovers {
		t.Fatalf("Stats = %+v; count(*) says %+v", st, want)
	}
}
