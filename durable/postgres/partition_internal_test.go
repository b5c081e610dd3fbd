package postgres

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/testkit/testenv"
)

const testPartitions = 8

// statement is one statement the store sends, with arguments as it sends
// them.
type statement struct {
	name string
	sql  string
	args []any
}

// hotStatements returns every statement the store sends for one record
// (claim, its insert-first form, replay read, renew, handover, complete, fail, mark uncertain,
// release, adopt, Do's insert at commit), with the arguments its methods bind, for a record held
// by a fresh claim.
func hotStatements(t testing.TB, s *internalStore) []statement {
	t.Helper()
	ctx := t.Context()
	p := storeapi.ClaimParams{Scope: durable.Scope{Tenant: "tenant", Operation: "POST /orders", Key: "k-prune"},
		Fingerprint: "v1:fp", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour}
	res, err := s.Claim(ctx, nil, p)
	if err != nil || !res.Acquired {
		t.Fatalf("Claim = %+v, %v", res, err)
	}
	ref, tok := res.Ref, res.Token
	digest := ref.Digest()
	// Do's write at commit inserts a record that does not exist yet.
	fresh := durable.Scope{Tenant: "tenant", Operation: "POST /orders", Key: "k-prune-at-commit"}.Ref(nil)
	freshDigest := fresh.Digest()
	bin, jsonHeaders, body, err := encodeResult(durable.Result{StatusCode: 201, Body: []byte(`{}`),
		Headers: map[string][]string{"Content-Type": {"application/json"}}})
	if err != nil {
		t.Fatal(err)
	}
	lease := time.Minute.Microseconds()
	return []statement{
		{"claim", s.q.claim, []any{ref.Tenant, ref.Operation, ref.KeyHash[:], p.Fingerprint, int64(0), pgUUID(p.Owner), lease,
			p.Retention.Microseconds(), digest[:]}},
		{"claim of a key Redis granted (insert first)", s.q.claimNew, []any{fresh.Tenant, fresh.Operation, fresh.KeyHash[:], p.Fingerprint, int64(7), pgUUID(p.Owner), lease,
			p.Retention.Microseconds(), freshDigest[:]}},
		{"get (replay read, re-read)", s.q.get, keyArgs(ref)},
		{"renew", s.q.renew, fenceArgs(ref, tok, lease)},
		{"handover", s.q.handover, fenceArgs(ref, tok, pgUUID(uuid.New()), lease)},
		{"complete", s.q.complete, fenceArgs(ref, tok, 201, jsonHeaders, body, 1, "", bin)},
		{"fail", s.q.fail, fenceArgs(ref, tok, 402, jsonHeaders, body, 1, "", bin)},
		{"mark uncertain", s.q.markUncertain, fenceArgs(ref, tok)},
		{"release", s.q.release, fenceArgs(ref, tok)},
		{"adopt", s.q.adopt, append(keyArgs(ref), int64(0), pgUUID(uuid.New()), lease)},
		{"insert at commit (Do's record)", s.q.insertCompleted, []any{fresh.Tenant, fresh.Operation, fresh.KeyHash[:], p.Fingerprint,
			time.Now().Add(-30 * time.Second).UnixMilli(), pgUUID(uuid.New()), 201, jsonHeaders, bin, body, 1, "",
			p.Retention.Microseconds(), freshDigest[:]}},
	}
}

// prunedTo reports the partitions plan touches; ok when it is exactly
// one, with no sequential scan.
func prunedTo(plan planNode, rels []string) (touched []string, ok bool) {
	a := accessOf(plan, rels)
	return a.touched, len(a.touched) == 1 && len(a.seqScans) == 0
}

// TestPartitionPruning creates a store WithPartitions(8), seeds it, and
// EXPLAINs every statement the store sends for one record with the
// arguments it binds: each must read or write exactly one partition (the
// claim's INSERT routes its row to the same one). The operation lookup
// (by operation_digest, which is not in the partition key) reads every
// partition, each by its index, as documented; so do Pending, Sweep and
// Stats, which are not per record. Negative controls: the check reports
// the operation lookup, and the claim's read with key_hash left out, as
// touching every partition.
func TestPartitionPruning(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t, WithPartitions(testPartitions))
	seed(t, s.pool, s.table, 20_000)
	ctx := t.Context()
	parent, leaves, err := tableRelations(ctx, s.pool, s.table)
	if err != nil {
		t.Fatal(err)
	}
	if len(leaves) != testPartitions {
		t.Fatalf("%d partitions, want %d", len(leaves), testPartitions)
	}
	rels := append([]string{parent}, leaves...)

	for _, st := range hotStatements(t, s) {
		plan, raw, err := explain(ctx, s.pool, st.sql, st.args...)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if st.sql == s.q.insertCompleted || st.sql == s.q.claimNew {
			// A one-row INSERT reads nothing: its plan names the parent
			// only, and the row is routed to its partition as it is
			// written.
			if a := accessOf(plan, rels); len(a.touched) != 0 || len(a.seqScans) != 0 {
				t.Errorf("%s reads %v (want no read at all):\n%s", st.name, a.touched, raw)
			}
			continue
		}
		if touched, ok := prunedTo(plan, rels); !ok {
			t.Errorf("%s touches %v (want exactly one partition, no Seq Scan):\n%s", st.name, touched, raw)
		} else {
			t.Logf("%s: %v", st.name, touched)
		}
	}

	digest := [32]byte{1}
	all := []statement{
		{"operation lookup", s.q.operation, []any{digest[:], "tenant"}},
		// Negative control: the claim's key without key_hash cannot prune.
		{"read without key_hash", strings.NewReplacer("AND r.key_hash = $3::bytea", "", "r.operation_digest = $4::bytea AND ", "").Replace(s.q.get), []any{"tenant", "POST /orders"}},
	}
	for _, st := range all {
		plan, raw, err := explain(ctx, s.pool, st.sql, st.args...)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		touched, ok := prunedTo(plan, rels)
		if ok || len(touched) != testPartitions {
			t.Errorf("%s: the check says it touches %v; want all %d partitions:\n%s", st.name, touched, testPartitions, raw)
		}
		if st.name == "operation lookup" {
			if a := accessOf(plan, rels); len(a.seqScans) > 0 {
				t.Errorf("the operation lookup reads %v with a Seq Scan:\n%s", a.seqScans, raw)
			}
		}
	}
}

// TestPartitionedCustomPlans runs the store's operations on one
// connection more often than the plan cache needs to consider a generic
// plan (5 executions), and checks in pg_prepared_statements that the
// server kept planning each statement for its arguments (custom plans,
// pruned while planning: only the one partition is locked and read), never
// a generic plan, which would lock every partition at each execution.
func TestPartitionedCustomPlans(t *testing.T) {
	t.Parallel()
	base := newInternalStore(t, WithPartitions(testPartitions))
	seed(t, base.pool, base.table, 5_000)
	cfg := base.pool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ds, err := New(pool, WithPartitions(testPartitions))
	if err != nil {
		t.Fatal(err)
	}
	s := ds.(*store)
	ctx := t.Context()
	res := durable.Result{StatusCode: 201, Body: []byte(`{}`)}
	for i := range 12 {
		p := storeapi.ClaimParams{Scope: durable.Scope{Tenant: "tenant", Operation: "POST /orders", Key: "k-plan-" + uuid.NewString()},
			Fingerprint: "v1:fp", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour}
		r, err := s.Claim(ctx, nil, p)
		if err != nil || !r.Acquired {
			t.Fatalf("Claim %d = %+v, %v", i, r, err)
		}
		if err := s.Renew(ctx, r.Ref, r.Token, time.Minute); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			err = s.Complete(ctx, nil, r.Ref, r.Token, res)
		} else {
			err = s.Release(ctx, nil, r.Ref, r.Token)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, r.Ref); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // a replay: the claim answered by the finished record
			p.Owner = uuid.New()
			if r2, err := s.Claim(ctx, nil, p); err != nil || r2.Acquired {
				t.Fatalf("replay Claim = %+v, %v", r2, err)
			}
		}
	}
	rows, err := pool.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	names := map[string]string{s.q.claim: "claim", s.q.renew: "renew", s.q.complete: "complete",
		s.q.release: "release", s.q.get: "get"}
	for rows.Next() {
		var sql string
		var generic, custom int64
		if err := rows.Scan(&sql, &generic, &custom); err != nil {
			t.Fatal(err)
		}
		name, ok := names[sql]
		if !ok {
			continue
		}
		seen[name] = true
		t.Logf("%s: %d generic, %d custom plans", name, generic, custom)
		if generic != 0 {
			t.Errorf("%s ran a generic plan %d times (custom %d)", name, generic, custom)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if !seen[name] {
			t.Errorf("%s is not among the connection's prepared statements", name)
		}
	}

	// Negative control: forced to generic plans, the same reads are
	// counted as such.
	gcfg := cfg.Copy()
	gcfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	gpool, err := pgxpool.NewWithConfig(ctx, gcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer gpool.Close()
	gs, err := New(gpool)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := gs.Ref(durable.Scope{Tenant: "tenant", Operation: "POST /orders", Key: "k-generic"})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := gs.Get(ctx, ref); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("Get = %v", err)
		}
	}
	var generic int64
	if err := gpool.QueryRow(ctx, `SELECT generic_plans FROM pg_prepared_statements WHERE statement = $1`, s.q.get).Scan(&generic); err != nil || generic == 0 {
		t.Fatalf("forced generic plans: get counted %d generic plans (%v); the check cannot see them", generic, err)
	}
}

// TestWithPartitionsMismatch: Migrate WithPartitions refuses, with a
// *partitionMismatchError, a table that exists unpartitioned or with
// another number of partitions, and changes nothing; Migrate without the
// option accepts a partitioned table; the same number again is a no-op.
func TestWithPartitionsMismatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	plain := newInternalStore(t)
	var pe *partitionMismatchError
	err := Migrate(ctx, plain.pool, WithPartitions(4))
	if !errors.As(err, &pe) || !errors.Is(err, ErrConfig) || pe.have != 0 || pe.want != 4 || pe.table != "idempotency_requests" {
		t.Fatalf("Migrate(WithPartitions(4)) on a plain table = %v; want a partitionMismatchError{have: 0, want: 4}", err)
	}
	part := newInternalStore(t, WithPartitions(4))
	err = Migrate(ctx, part.pool, WithPartitions(8))
	if !errors.As(err, &pe) || pe.have != 4 || pe.want != 8 {
		t.Fatalf("Migrate(WithPartitions(8)) on 4 partitions = %v; want a partitionMismatchError{have: 4, want: 8}", err)
	}
	if err := Migrate(ctx, part.pool, WithPartitions(4)); err != nil {
		t.Fatalf("Migrate(WithPartitions(4)) again: %v", err)
	}
	if err := Migrate(ctx, part.pool); err != nil {
		t.Fatalf("Migrate without WithPartitions on a partitioned table: %v", err)
	}
	for _, s := range []*internalStore{plain, part} {
		_, leaves, err := tableRelations(ctx, s.pool, s.table)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[*internalStore]int{plain: 1, part: 4}[s]; len(leaves) != want {
			t.Errorf("after the refused Migrate: %d leaf tables %v, want %d", len(leaves), leaves, want)
		}
	}
	// A table with 4 hash partitions on another key is refused too.
	sch := testenv.Postgres(t)
	ddl := `CREATE TABLE idempotency_requests (tenant_id text, operation text, key_hash bytea,
		PRIMARY KEY (tenant_id, operation, key_hash)) PARTITION BY HASH (tenant_id);`
	for i := range 4 {
		ddl += fmt.Sprintf(" CREATE TABLE idempotency_requests_p%d PARTITION OF idempotency_requests FOR VALUES WITH (MODULUS 4, REMAINDER %d);", i, i)
	}
	if _, err := sch.Pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	err = Migrate(ctx, sch.Pool, WithPartitions(4))
	if !errors.As(err, &pe) || pe.have != 0 || pe.want != 4 {
		t.Fatalf("Migrate(WithPartitions(4)) on a table partitioned by tenant_id = %v; want a partitionMismatchError{have: 0}", err)
	}
	for _, n := range []int{-1, 0, 1, 1025} {
		if _, err := newConfig([]Option{WithPartitions(n)}); !errors.Is(err, ErrConfig) {
			t.Errorf("WithPartitions(%d) = %v; want ErrConfig", n, err)
		}
	}
	for _, n := range []int{2, 1024} {
		if _, err := newConfig([]Option{WithPartitions(n)}); err != nil {
			t.Errorf("WithPartitions(%d) = %v", n, err)
		}
	}
}
