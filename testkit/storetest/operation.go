package storetest

// The operation resource: a record read by its operation identity, within
// one tenant; and migration 003 giving existing rows their identity.

import (
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// mustOperation reads the record of ref by its operation identity in its
// own tenant and checks it is that record.
func mustOperation[TTx any](t testing.TB, s storeapi.Store[TTx], ref durable.Ref) durable.Record {
	t.Helper()
	rec, err := s.Operation(ctxFor(t), ref.Tenant, ref.Digest())
	if err != nil {
		t.Fatalf("Operation(%s): %v", ref.OperationID(), err)
	}
	if rec.Ref != ref || rec.Ref.OperationID() != ref.OperationID() {
		t.Fatalf("Operation(%s) read record %s; want %s", ref.OperationID(), rec.Ref.OperationID(), ref.OperationID())
	}
	return rec
}

// operationNotFound checks that tenant cannot read the operation of digest.
func operationNotFound[TTx any](t testing.TB, s storeapi.Store[TTx], what, tenant string, digest [32]byte) {
	t.Helper()
	if rec, err := s.Operation(ctxFor(t), tenant, digest); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("%s: Operation = %+v, %v; want ErrNotFound", what, rec, err)
	}
}

// A record is read by its operation identity in its own tenant through every
// state and a takeover; another tenant (even one holding a record of the
// same operation and key) and an unknown identity get ErrNotFound alike.
func (c *contract[TTx]) operationByID(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	tok := mustAcquire(t, s, params(sc, fp1, short, long))
	rec := mustOperation(t, s, ref)
	checkState(t, "processing", rec, durable.Processing)
	checkToken(t, "processing", rec.Token, tok)

	// Another tenant with the same operation and key: its own record, its
	// own identity; neither tenant reads the other's.
	other := sc
	other.Tenant = "tenant-b"
	oref := mustRef(t, s, other)
	if oref.Digest() == ref.Digest() {
		t.Fatal("two tenants share an operation identity")
	}
	mustAcquire(t, s, params(other, fp1, long, long))
	operationNotFound(t, s, "another tenant's id", other.Tenant, ref.Digest())
	operationNotFound(t, s, "the other way round", sc.Tenant, oref.Digest())
	operationNotFound(t, s, "an unknown id", sc.Tenant, [32]byte{1, 2, 3})
	mustOperation(t, s, oref)

	// A takeover keeps the identity.
	waitLeaseExpired(t, s, ref)
	p := params(sc, fp1, long, long)
	r, err := s.Claim(ctx, noTx[TTx](), p)
	must(t, "takeover", err)
	if !r.Acquired || !r.Takeover {
		t.Fatalf("takeover: %+v", r)
	}
	if got := mustOperation(t, s, ref); got.Token != r.Token {
		t.Fatalf("after the takeover Operation reads token %v; want %v", got.Token, r.Token)
	}

	// Finished: the stored result is read back.
	must(t, "complete", s.Complete(ctx, noTx[TTx](), ref, r.Token, sampleResult()))
	rec = mustOperation(t, s, ref)
	checkState(t, "completed", rec, durable.Completed)
	if !equalResult(rec.Result, sampleResult()) || rec.CompletedAt.IsZero() {
		t.Fatalf("completed operation: result %+v completed at %v", rec.Result, rec.CompletedAt)
	}
	operationNotFound(t, s, "another tenant's id once completed", other.Tenant, ref.Digest())

	// Uncertain too.
	sc3 := newScope()
	ref3 := mustRef(t, s, sc3)
	tok3 := mustAcquire(t, s, params(sc3, fp1, long, long))
	must(t, "mark uncertain", s.MarkUncertain(ctx, ref3, tok3))
	checkState(t, "uncertain", mustOperation(t, s, ref3), durable.Uncertain)
}

// Migration 003 on a table that already holds rows (written by the
// migrations before it): every row gets the identity the Claimer hands out,
// tenant-scoped, and new claims write theirs.
func (c *contract[TTx]) operationMigration(t *testing.T) {
	scopes := []durable.Scope{newScope(), newScope(), newScope()}
	scopes[1].Tenant = "tenant-b"
	scopes[2].Operation = "DELETE /orders/{id}"
	scopes[2].Tenant = "tenant-ü ünicode"
	refs := make([]durable.Ref, len(scopes))
	for i, sc := range scopes {
		refs[i] = sc.Ref(nil)
	}
	s := c.h.Upgrade(t, refs)
	for i, ref := range refs {
		rec := mustOperation(t, s, ref)
		checkState(t, "pre-existing row", rec, durable.Completed)
		other := refs[(i+1)%len(refs)].Tenant
		if other == ref.Tenant {
			other = "tenant-z"
		}
		operationNotFound(t, s, "another tenant's id of a pre-existing row", other, ref.Digest())
	}
	// The store works on the upgraded table: a new claim is read by its id.
	sc := newScope()
	ref := mustRef(t, s, sc)
	tok := mustAcquire(t, s, params(sc, fp1, long, long))
	if got := mustOperation(t, s, ref); got.Token != (fence.Token{Generation: tok.Generation, Owner: tok.Owner}) {
		t.Fatalf("new claim on the upgraded table: token %v; want %v", got.Token, tok)
	}
}

// Handover: the holder of a token hands its claim on, live or expired, once:
// of concurrent handovers of one token exactly one succeeds (generation
// +1), the others and the old token are fenced; a finished record cannot be
// handed over.
func (c *contract[TTx]) handover(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	tok := mustAcquire(t, s, params(sc, fp1, long, long))
	const n = 16
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  []fence.Token
		errs []error
	)
	for range n {
		wg.Go(func() {
			nt, err := s.Handover(ctx, ref, tok, uuid.New(), long)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				won = append(won, nt)
			} else {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("%d of %d concurrent handovers of one token succeeded; want 1 (errors %v)", len(won), n, errs)
	}
	for _, err := range errs {
		wantErr(t, "a losing handover", err, durable.ErrFenced)
	}
	nt := won[0]
	if nt.Generation != tok.Generation+1 || nt.Owner == tok.Owner {
		t.Fatalf("handed over to %v from %v; want generation +1 and the new owner", nt, tok)
	}
	rec := mustGet(t, s, ref)
	checkState(t, "after the handover", rec, durable.Processing)
	checkToken(t, "after the handover", rec.Token, nt)
	wantErr(t, "Complete with the handed-over token", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult()), durable.ErrFenced)

	// An expired lease is handed over too, by its holder only.
	sc2 := newScope()
	ref2 := mustRef(t, s, sc2)
	tok2 := mustAcquire(t, s, params(sc2, fp1, short, long))
	waitLeaseExpired(t, s, ref2)
	if _, err := s.Handover(ctx, ref2, fence.Token{Generation: tok2.Generation, Owner: uuid.New()}, uuid.New(), long); !errors.Is(err, durable.ErrFenced) {
		t.Fatalf("handover by another owner = %v; want ErrFenced", err)
	}
	nt2, err := s.Handover(ctx, ref2, tok2, uuid.New(), long)
	must(t, "handover of an expired lease", err)
	if rec := mustGet(t, s, ref2); rec.LeaseRemaining <= 0 || rec.Token != nt2 {
		t.Fatalf("after handing over an expired lease: %+v", rec)
	}

	// A finished record is not handed over.
	must(t, "complete", s.Complete(ctx, noTx[TTx](), ref, nt, sampleResult()))
	if _, err := s.Handover(ctx, ref, nt, uuid.New(), long); !errors.Is(err, durable.ErrFenced) {
		t.Fatalf("handover of a completed record = %v; want ErrFenced", err)
	}
	checkState(t, "completed, after a refused handover", mustGet(t, s, ref), durable.Completed)
}
