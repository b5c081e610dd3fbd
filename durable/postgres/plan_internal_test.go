package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/testkit/testenv"
)

// planNode is one node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType        string     `json:"Node Type"`
	Relation        string     `json:"Relation Name"`
	Index           string     `json:"Index Name"`
	SubplansRemoved int        `json:"Subplans Removed"`
	Targets         []planNode `json:"Target Tables"`
	Plans           []planNode `json:"Plans"`
}

// walk calls fn on n and every node under it.
func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// explain returns the plan of sql with args, as the server plans it when
// the store sends it: the arguments are bound, so the plan is the custom
// plan of those values (the one plan_cache_mode=auto keeps when the
// generic one costs more, as it does on a partitioned table).
func explain(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) (planNode, string, error) {
	var raw string
	if err := q.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		return planNode{}, "", err
	}
	var top []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(raw), &top); err != nil || len(top) != 1 {
		return planNode{}, raw, fmt.Errorf("EXPLAIN JSON: %v (%d plans)", err, len(top))
	}
	return top[0].Plan, raw, nil
}

// tableRelations returns the store's table and, when it is partitioned, its
// partitions (unqualified names, as EXPLAIN reports them).
func tableRelations(ctx context.Context, pool *pgxpool.Pool, table string) (parent string, leaves []string, err error) {
	// pg_partition_tree has no rows for a table that is not partitioned.
	rows, err := pool.Query(ctx, `SELECT c.relname, t.isleaf, t.level FROM (
			SELECT relid, isleaf, level FROM pg_partition_tree(to_regclass($1))
			UNION ALL
			SELECT oid, true, 0 FROM pg_class WHERE oid = to_regclass($1) AND relkind = 'r'
		) t JOIN pg_class c ON c.oid = t.relid ORDER BY t.level, c.relname`, table)
	if err != nil {
		return "", nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var leaf bool
		var level int
		if err := rows.Scan(&name, &leaf, &level); err != nil {
			return "", nil, err
		}
		if level == 0 {
			parent = name
		}
		if leaf {
			leaves = append(leaves, name)
		}
	}
	return parent, leaves, rows.Err()
}

// access is what a plan does to the store's table.
type access struct {
	seqScans []string // relations of the table read by a Seq Scan
	indexes  []string // indexes of the table read
	touched  []string // distinct relations of the table scanned or written
}

// accessOf summarizes plan's access to the relations rels (the table and
// its partitions).
func accessOf(plan planNode, rels []string) access {
	var a access
	touch := func(rel string) {
		if slices.Contains(rels, rel) && !slices.Contains(a.touched, rel) {
			a.touched = append(a.touched, rel)
		}
	}
	plan.walk(func(n planNode) {
		if n.NodeType == "Bitmap Index Scan" { // names its index, not its table
			a.indexes = append(a.indexes, n.Index)
		}
		if !slices.Contains(rels, n.Relation) {
			return
		}
		if n.NodeType == "Seq Scan" {
			a.seqScans = append(a.seqScans, n.Relation)
		}
		if n.Index != "" {
			a.indexes = append(a.indexes, n.Index)
		}
		if n.NodeType != "ModifyTable" {
			touch(n.Relation)
		}
		for _, t := range n.Targets {
			touch(t.Relation)
		}
	})
	return a
}

// recorder records the SQL of every statement a pool runs.
type recorder struct {
	mu  sync.Mutex
	sql []string
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.sql = append(r.sql, d.SQL)
	r.mu.Unlock()
	return ctx
}
func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *recorder) reset() { r.mu.Lock(); r.sql = nil; r.mu.Unlock() }

func (r *recorder) ran(sql string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.sql, sql)
}

// internalStore is a migrated store on a fresh schema, seen from inside the
// package, with a recorder on its pool.
type internalStore struct {
	*store
	pool  *pgxpool.Pool
	rec   *recorder
	table string // as the statements name it
}

func newInternalStore(t testing.TB, opts ...Option) *internalStore {
	t.Helper()
	sch := testenv.Postgres(t)
	cfg, err := pgxpool.ParseConfig(sch.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := ConfigurePool(cfg, opts...); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	cfg.ConnConfig.Tracer = rec
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool, opts...); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	ds, err := New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s := ds.(*store)
	table := s.cfg.table
	if s.cfg.schema != "" {
		table = s.cfg.schema + "." + table
	}
	return &internalStore{store: s, pool: pool, rec: rec, table: table}
}

// seedMix holds what seed wrote, counted as the store must count it.
type seedMix struct {
	leased, stale, released, uncertain, stuck, completed, failed, unswept, takeovers int64
}

// seed writes n records with plain SQL, in the store's format, in a mix
// like a production table's: the first 2,000 hold the small sets Stats
// counts exactly (30 leased, 20 stale, 30 released, 40 uncertain, 10 stuck
// past retention, 300 finished past retention and not swept), the rest are
// finished within retention (one retention of a day, created over the last
// n seconds; every 16th failed); every 700th was taken over (1 to 3 times).
// It then runs VACUUM ANALYZE (as autovacuum would have) and returns the
// exact counts, as the test computes them with count(*).
func seed(t testing.TB, pool *pgxpool.Pool, table string, n int) seedMix {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// k picks the record's kind: 0-29 leased live, 30-49 stale, 50-79
	// released, 80-119 uncertain, 120-129 stuck, 130-429 expired unswept,
	// 430 and above finished within retention.
	q := strings.ReplaceAll(`INSERT INTO %T (tenant_id, operation, key_hash, request_hash, state, generation,
	owner_token, lease_expires_at, status_code, response_body, response_version, takeovers,
	created_at, completed_at, expires_at, retention_us, operation_digest)
SELECT 'tenant', 'POST /orders', sha256(int8send(i)), 'v1:fp',
	(CASE WHEN k < 80 OR (k >= 120 AND k < 130) THEN 'processing'
		WHEN k < 120 THEN 'uncertain'
		WHEN k < 430 OR i % 16 <> 0 THEN 'completed' ELSE 'failed' END)::idempotency_state,
	1 + i,
	CASE WHEN k >= 50 AND k < 80 THEN NULL ELSE gen_random_uuid() END,
	CASE WHEN k < 30 OR (k >= 120 AND k < 130) THEN now() + interval '1 hour'
		WHEN k < 50 THEN now() - interval '1 minute' END,
	CASE WHEN k >= 130 THEN 201 END, CASE WHEN k >= 130 THEN '\x7b7d'::bytea END, CASE WHEN k >= 130 THEN 1 END,
	CASE WHEN i % 700 = 0 THEN 1 + i % 3 ELSE 0 END,
	now() - i * interval '1 second', CASE WHEN k >= 130 THEN now() - i * interval '1 second' END,
	CASE WHEN (k >= 120 AND k < 430) THEN now() - interval '1 hour' - i * interval '1 second'
		ELSE now() - i * interval '1 second' + interval '1 day' END,
	86400000000, sha256(int8send(-i))
FROM generate_series(1, $1::bigint) i, LATERAL (SELECT CASE WHEN i <= 2000 THEN i - 1 ELSE 430 + i % 16 END AS k) kk`, "%T", table)
	if _, err := pool.Exec(ctx, q, n); err != nil {
		t.Fatalf("seed: %v", err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
		t.Fatal(err)
	}
	count := func(where string) int64 {
		var c int64
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE "+where).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var m seedMix
	m.leased = count(`state = 'processing' AND owner_token IS NOT NULL`)
	m.stale = count(`state = 'processing' AND owner_token IS NOT NULL AND lease_expires_at <= now()`)
	m.released = count(`state = 'processing' AND owner_token IS NULL`)
	m.uncertain = count(`state = 'uncertain'`)
	m.stuck = count(`((state = 'processing' AND owner_token IS NOT NULL) OR state = 'uncertain') AND expires_at <= now()`)
	m.completed = count(`state = 'completed'`)
	m.failed = count(`state = 'failed'`)
	m.unswept = count(`(state IN ('completed', 'failed') OR (state = 'processing' AND owner_token IS NULL)) AND expires_at <= now()`)
	if err := pool.QueryRow(ctx, "SELECT COALESCE(sum(takeovers), 0) FROM "+table).Scan(&m.takeovers); err != nil {
		t.Fatal(err)
	}
	if m.stale == 0 || m.released == 0 || m.uncertain == 0 || m.stuck == 0 || m.unswept == 0 || m.takeovers == 0 || m.failed == 0 {
		t.Fatalf("the seed lacks a kind of record: %+v", m)
	}
	return m
}
