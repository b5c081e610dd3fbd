package sqlite_test

import (
	"testing"
	"time"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/sqlite"
)

// stepRows counts the rows of the steps table of s for ref's operation, of
// every life, with plain SQL: what the store's own reads, which see the
// current life only, cannot show.
func stepRows(t testing.TB, s *sqlite.Store, ref durable.Ref) int {
	t.Helper()
	d := ref.Digest()
	var n int
	if err := s.DB().QueryRowContext(t.Context(), `SELECT count(*) FROM `+s.Table()+`_steps WHERE operation_digest = ?1`,
		d[:]).Scan(&n); err != nil {
		t.Fatalf("count steps: %v", err)
	}
	return n
}

// started reports whether StartStep answered that the step is started and
// its function must run.
func started(r storeapi.StepStart) bool {
	return !r.Finished && !r.Repeated && !r.Uncertain && r.Result == nil
}

func mustStartStep(t testing.TB, s *sqlite.Store, ref durable.Ref, r storeapi.ClaimResult, seq int, name string) {
	t.Helper()
	got, err := s.StartStep(t.Context(), ref, r.Token, storeapi.StepParams{Seq: seq, Name: name})
	if err != nil || !started(got) {
		t.Fatalf("StartStep(%d %s) = %+v, %v; want it started", seq, name, got, err)
	}
}

// Sweep deletes the steps of the records it deletes, in its transaction:
// those of a completed record, and those a released record kept from its
// earlier life. The steps of a record it keeps stay. A table of another
// name (WithTable) has its own steps table.
func TestStore_SweepDeletesSteps(t *testing.T) {
	t.Parallel()
	s := open(t, sqlite.WithTable("swept_requests"))
	ctx := t.Context()
	short := func(fp string) storeapi.ClaimParams {
		return withRetention(withLease(params(newScope(), fp), 10*time.Millisecond), 20*time.Millisecond)
	}

	done := mustClaim(t, s, short("v1:done"))
	mustStartStep(t, s, done.Ref, done, 0, "reserve")
	if err := s.FinishStep(ctx, done.Ref, done.Token, 0, []byte("r")); err != nil {
		t.Fatal(err)
	}
	mustStartStep(t, s, done.Ref, done, 1, "charge")
	if err := s.Complete(ctx, nil, done.Ref, done.Token, okResult); err != nil {
		t.Fatal(err)
	}
	released := mustClaim(t, s, short("v1:released"))
	mustStartStep(t, s, released.Ref, released, 0, "reserve")
	if err := s.Release(ctx, nil, released.Ref, released.Token); err != nil {
		t.Fatal(err)
	}
	kept := mustClaim(t, s, params(newScope(), "v1:kept"))
	mustStartStep(t, s, kept.Ref, kept, 0, "reserve")

	if n := stepRows(t, s, done.Ref) + stepRows(t, s, released.Ref) + stepRows(t, s, kept.Ref); n != 4 {
		t.Fatalf("%d step rows before the sweep; want 4", n)
	}
	for _, ref := range []durable.Ref{done.Ref, released.Ref} {
		waitRetentionPassed(t, s, ref)
		waitSweepable(t, s, ref)
	}
	if n, err := s.Sweep(ctx, 100); err != nil || n != 2 {
		t.Fatalf("Sweep = %d, %v; want the 2 records", n, err)
	}
	for name, ref := range map[string]durable.Ref{"completed": done.Ref, "released": released.Ref} {
		if n := stepRows(t, s, ref); n != 0 {
			t.Fatalf("%d step rows of the swept %s record are left", n, name)
		}
	}
	if n := stepRows(t, s, kept.Ref); n != 1 {
		t.Fatalf("%d step rows of the record the sweep kept; want 1", n)
	}
	if steps, err := s.Steps(ctx, kept.Ref, false); err != nil || len(steps) != 1 {
		t.Fatalf("Steps of the kept record = %+v, %v", steps, err)
	}
}

// A restart is a new life, strictly after the one before, even where the
// database's clock (millisecond resolution) reads the same or less at the
// restart than at the creation before it: here the stored created_at is
// moved ten seconds ahead, with the step rows of that life, as a release and
// a new claim within one millisecond (or a clock stepped back) would leave
// them. The new operation must not see the old one's finished step.
func TestStore_RestartIsANewLife(t *testing.T) {
	t.Parallel()
	s := open(t)
	ctx := t.Context()
	sc := newScope()
	a := mustClaim(t, s, params(sc, "v1:a"))
	mustStartStep(t, s, a.Ref, a, 0, "charge")
	if err := s.FinishStep(ctx, a.Ref, a.Token, 0, []byte("ch_old")); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, nil, a.Ref, a.Token); err != nil {
		t.Fatal(err)
	}
	const ahead = 10_000_000 // µs
	if _, err := s.DB().ExecContext(ctx, `UPDATE idempotency_requests SET created_at = created_at + ?4
WHERE tenant_id = ?1 AND operation = ?2 AND key_hash = ?3`, a.Ref.Tenant, a.Ref.Operation, a.Ref.KeyHash[:], ahead); err != nil {
		t.Fatal(err)
	}
	d := a.Ref.Digest()
	if _, err := s.DB().ExecContext(ctx, `UPDATE idempotency_requests_steps SET life = life + ?2 WHERE operation_digest = ?1`,
		d[:], ahead); err != nil {
		t.Fatal(err)
	}
	old := mustGet(t, s, a.Ref).CreatedAt
	if steps, err := s.Steps(ctx, a.Ref, false); err != nil || len(steps) != 1 {
		t.Fatalf("Steps of the moved life = %+v, %v; want its charge", steps, err)
	}

	b := mustClaim(t, s, params(sc, "v1:b"))
	if !b.Acquired || !b.Restarted {
		t.Fatalf("claim of the released record: %+v", b)
	}
	if created := mustGet(t, s, a.Ref).CreatedAt; !created.After(old) {
		t.Fatalf("restarted at %v, not after the earlier life %v", created, old)
	}
	if steps, err := s.Steps(ctx, a.Ref, false); err != nil || len(steps) != 0 {
		t.Fatalf("Steps of the new operation = %+v, %v; want none", steps, err)
	}
	got, err := s.StartStep(ctx, a.Ref, b.Token, storeapi.StepParams{Seq: 0, Name: "charge"})
	if err != nil || !started(got) {
		t.Fatalf("StartStep of the new operation = %+v, %v; want it to run, not the old result", got, err)
	}
}
