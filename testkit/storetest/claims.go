package storetest

// Claims: one winner, takeover after the lease, generations, mismatch,
// isolation and invalid parameters.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// invalidArgument is the form of an invalid-argument error: it names the
// field and says why ("durable: invalid lease: shorter than 1ms").
var invalidArgument = regexp.MustCompile(`durable: invalid [a-z_ ]+: \S`)

// 1. 64 goroutines claim one scope at once: exactly one acquires; all the
// others see its processing record.
func (c *contract[TTx]) concurrentClaims(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	const n = 64
	out := make([]outcome, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := s.Claim(ctx, noTx[TTx](), params(sc, fp1, long, long))
			out[i] = outcome{r, err}
		})
	}
	close(start)
	wg.Wait()
	var winner fence.Token
	acquired := 0
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("claim %d: %v", i, o.err)
		}
		if o.res.Acquired {
			acquired++
			winner = o.res.Token
		}
	}
	if acquired != 1 {
		t.Fatalf("%d of %d concurrent claims acquired; want exactly 1", acquired, n)
	}
	for i, o := range out {
		if o.res.Acquired {
			continue
		}
		r := o.res.Record
		if r == nil {
			t.Fatalf("claim %d: neither acquired nor given the existing record", i)
		}
		if r.State != durable.Processing || r.Released || (r.Token != winner) || r.LeaseRemaining <= 0 || r.Fingerprint != fp1 {
			t.Fatalf("claim %d saw %+v; want the winner's live processing record %v", i, *r, winner)
		}
	}
	rec := mustGet(t, s, mustRef(t, s, sc))
	checkState(t, "after the race", rec, durable.Processing)
	checkToken(t, "after the race", rec.Token, winner)
	if rec.Takeovers != 0 || winner.Generation < generationFloor(rec) {
		t.Fatalf("takeovers %d, generation %d; want 0 and a fresh generation of at least %d", rec.Takeovers, winner.Generation, generationFloor(rec))
	}
}

// 2. A takeover happens only after the lease expired by the database's
// clock; the generation rises, the old owner is fenced, the new one
// completes.
func (c *contract[TTx]) takeover(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)

	sc := newScope()
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	rec := mustNotAcquire(t, s, params(sc, fp1, long, long))
	checkState(t, "live lease", rec, durable.Processing)
	checkToken(t, "live lease", rec.Token, a)
	if rec.LeaseRemaining <= 0 {
		t.Fatalf("live lease reported with LeaseRemaining %v", rec.LeaseRemaining)
	}

	sc = newScope()
	ref := mustRef(t, s, sc)
	a = mustAcquire(t, s, params(sc, fp1, short, long))
	waitLeaseExpired(t, s, ref)
	// An expired lease is not free for another request.
	_, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	wantErr(t, "claim with another fingerprint after expiry", err, durable.ErrMismatch)
	checkToken(t, "after the mismatch", mustGet(t, s, ref).Token, a)

	pb := params(sc, fp1, long, long)
	res, err := s.Claim(ctx, noTx[TTx](), pb)
	must(t, "takeover claim", err)
	if !res.Acquired || !res.Takeover || res.Restarted {
		t.Fatalf("takeover claim = %+v; want acquired as a takeover", res)
	}
	b := res.Token
	if b.Owner != pb.Owner || b.Generation <= a.Generation {
		t.Fatalf("takeover token %v after %v; want the new owner and a higher generation", b, a)
	}

	wantErr(t, "old owner's Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	rec = mustGet(t, s, ref)
	checkState(t, "after the fenced Complete", rec, durable.Processing)
	checkToken(t, "after the fenced Complete", rec.Token, b)
	if rec.Result != nil || rec.Takeovers != 1 {
		t.Fatalf("after the fenced Complete: result %+v, takeovers %d; want none and 1", rec.Result, rec.Takeovers)
	}
	wantErr(t, "old owner's Fail", s.Fail(ctx, noTx[TTx](), ref, a, rejection()), durable.ErrFenced)
	wantErr(t, "old owner's Renew", s.Renew(ctx, ref, a, long), durable.ErrFenced)
	wantErr(t, "old owner's MarkUncertain", s.MarkUncertain(ctx, ref, a), durable.ErrFenced)
	wantErr(t, "old owner's Release", s.Release(ctx, noTx[TTx](), ref, a), durable.ErrFenced)

	won := durable.Result{StatusCode: 200, Body: []byte("new owner"), Version: 1}
	must(t, "new owner's Complete", s.Complete(ctx, noTx[TTx](), ref, b, won))
	wantErr(t, "old owner's late Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	rec = mustGet(t, s, ref)
	checkState(t, "after completion", rec, durable.Completed)
	checkToken(t, "after completion", rec.Token, b)
	if !equalResult(rec.Result, won) {
		t.Fatalf("stored result %+v; want the new owner's %+v", rec.Result, won)
	}
}

// 3. The database's generation is GREATEST(proposed, stored+1), and the
// returned token is the database's. A record created without a (high
// enough) proposal starts at the clock floor: the database's clock in
// milliseconds since the Unix epoch minus 60000, never above the clock.
func (c *contract[TTx]) proposedGeneration(t *testing.T) {
	s := c.h.New(t)
	sc0 := newScope()
	g0 := mustAcquire(t, s, params(sc0, fp1, long, long)).Generation
	rec := mustGet(t, s, mustRef(t, s, sc0))
	if g0 < generationFloor(rec) || g0 > uint64(rec.CreatedAt.UnixMilli()) {
		t.Fatalf("fresh claim without a proposal at %v: generation %d; want between the clock floor %d and the clock %d",
			rec.CreatedAt, g0, generationFloor(rec), rec.CreatedAt.UnixMilli())
	}
	low := params(newScope(), fp1, long, long)
	low.Proposed = 10
	g := mustAcquire(t, s, low).Generation
	if rec := mustGet(t, s, mustRef(t, s, low.Scope)); g < generationFloor(rec) {
		t.Fatalf("fresh claim proposing 10: generation %d; want at least the clock floor %d", g, generationFloor(rec))
	}
	base := g0 + 1_000_000 // a proposal far above the clock floor
	sc := newScope()
	ref := mustRef(t, s, sc)
	step := func(proposed, want uint64, lease time.Duration) {
		t.Helper()
		p := params(sc, fp1, lease, long)
		p.Proposed = proposed
		tok := mustAcquire(t, s, p)
		if tok.Generation != want {
			t.Fatalf("proposed %d: generation %d; want %d", proposed, tok.Generation, want)
		}
		checkToken(t, fmt.Sprintf("stored after proposing %d", proposed), mustGet(t, s, ref).Token, tok)
	}
	step(base+10, base+10, short) // above nothing: the proposal
	waitLeaseExpired(t, s, ref)
	step(base+3, base+11, short) // below the stored one: stored+1
	waitLeaseExpired(t, s, ref)
	step(base+11, base+12, short) // equal to the stored one: stored+1
	waitLeaseExpired(t, s, ref)
	step(base+100, base+100, long) // above: the proposal
}

// 4. Same scope, different fingerprint: ErrMismatch while processing and
// after completion, and nothing changes.
func (c *contract[TTx]) mismatch(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	res, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	wantErr(t, "claim with another fingerprint while processing", err, durable.ErrMismatch)
	if res.Acquired {
		t.Fatal("a mismatching claim acquired")
	}
	rec := mustGet(t, s, ref)
	checkToken(t, "after the mismatch", rec.Token, a)
	if rec.Fingerprint != fp1 {
		t.Fatalf("fingerprint %q; want %q", rec.Fingerprint, fp1)
	}
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()))
	res, err = s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	wantErr(t, "claim with another fingerprint after completion", err, durable.ErrMismatch)
	if res.Acquired {
		t.Fatal("a mismatching claim acquired a completed record")
	}
	rec = mustGet(t, s, ref)
	checkState(t, "after the mismatch", rec, durable.Completed)
	if !equalResult(rec.Result, sampleResult()) || rec.Fingerprint != fp1 {
		t.Fatalf("completed record changed by a mismatching claim: %+v", rec)
	}
}

// 8. Two tenants, or two operations, with the same key never interact.
func (c *contract[TTx]) isolation(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	key := newScope().Key
	scopes := []durable.Scope{
		{Tenant: "tenant-a", Operation: "POST /orders", Key: key},
		{Tenant: "tenant-b", Operation: "POST /orders", Key: key},
		{Tenant: "tenant-a", Operation: "POST /refunds", Key: key},
		{Tenant: "tenant-b", Operation: "POST /refunds", Key: key},
		{Tenant: "tenant-aPOST /orders", Operation: "x", Key: key}, // no concatenation collision
	}
	refs := make([]durable.Ref, len(scopes))
	toks := make([]fence.Token, len(scopes))
	ids := map[string]bool{}
	for i, sc := range scopes {
		refs[i] = mustRef(t, s, sc)
		ids[refs[i].OperationID()] = true
		fp := fp1
		if i%2 == 1 {
			fp = fp2 // a different request under the same key: no mismatch across scopes
		}
		p := params(sc, fp, long, long)
		res, err := s.Claim(ctx, noTx[TTx](), p)
		must(t, fmt.Sprintf("claim of scope %d", i), err)
		if !res.Acquired || res.Takeover || res.Restarted || res.Token.Owner != p.Owner {
			t.Fatalf("scope %d: claim = %+v; want a fresh acquisition of its own record", i, res)
		}
		toks[i] = res.Token
	}
	if len(ids) != len(scopes) {
		t.Fatal("two scopes share an operation identity")
	}
	must(t, "Complete scope 0", s.Complete(ctx, noTx[TTx](), refs[0], toks[0], sampleResult()))
	must(t, "Release scope 1", s.Release(ctx, noTx[TTx](), refs[1], toks[1]))
	must(t, "MarkUncertain scope 2", s.MarkUncertain(ctx, refs[2], toks[2]))
	wantErr(t, "scope 3 completed with scope 0's token", s.Complete(ctx, noTx[TTx](), refs[3], toks[0], sampleResult()), durable.ErrFenced)
	for i, want := range []durable.State{durable.Completed, durable.Processing, durable.Uncertain, durable.Processing, durable.Processing} {
		rec := mustGet(t, s, refs[i])
		checkState(t, fmt.Sprintf("scope %d", i), rec, want)
		if rec.Ref != refs[i] {
			t.Fatalf("scope %d: record of ref %v", i, rec.Ref)
		}
		if i >= 3 {
			checkToken(t, fmt.Sprintf("scope %d", i), rec.Token, toks[i])
		}
	}
}

// 12. A generation never decreases for a scope, across takeovers, releases,
// adoptions and retention restarts, whatever is proposed.
func (c *contract[TTx]) monotonic(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	var last uint64
	seen := func(step string, tok fence.Token) {
		t.Helper()
		if tok.Generation <= last {
			t.Fatalf("%s: generation %d after %d; generations must rise", step, tok.Generation, last)
		}
		if g := mustGet(t, s, ref).Token.Generation; g != tok.Generation {
			t.Fatalf("%s: stored generation %d; returned %d", step, g, tok.Generation)
		}
		last = tok.Generation
	}
	claim := func(step string, fp string, proposed uint64, lease, retention time.Duration) fence.Token {
		t.Helper()
		p := params(sc, fp, lease, retention)
		p.Proposed = proposed
		tok := mustAcquire(t, s, p)
		seen(step, tok)
		return tok
	}

	claim("first claim", fp1, 5, short, long)
	waitLeaseExpired(t, s, ref)
	tok := claim("takeover with a lower proposal", fp1, 1, long, long)
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, tok))
	tok = claim("claim after release, no proposal", fp2, 0, long, short)
	must(t, "MarkUncertain", s.MarkUncertain(ctx, ref, tok))
	adopted, err := s.Adopt(ctx, ref, uuid.New(), 2, long)
	must(t, "Adopt", err)
	seen("adoption with a lower proposal", adopted)
	must(t, "Complete by the adopter", s.Complete(ctx, noTx[TTx](), ref, adopted, sampleResult()))
	waitRetentionPassed(t, s, ref)
	tok = claim("restart past retention with a lower proposal", fp1, 1, long, long)
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, tok))
	tok = claim("claim after release with a higher proposal", fp1, 50, long, long)
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, tok))
	claim("claim after release with an old proposal", fp1, 3, long, long)
}

// 10b. Invalid scopes and claim parameters return ErrInvalidScope and write
// nothing.
func (c *contract[TTx]) invalid(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	base := params(newScope(), fp1, long, long)
	cases := map[string]func(p *storeapi.ClaimParams){
		"empty tenant":           func(p *storeapi.ClaimParams) { p.Scope.Tenant = "" },
		"tenant not UTF-8":       func(p *storeapi.ClaimParams) { p.Scope.Tenant = "t\xff" },
		"tenant too long":        func(p *storeapi.ClaimParams) { p.Scope.Tenant = strings.Repeat("t", 513) },
		"empty operation":        func(p *storeapi.ClaimParams) { p.Scope.Operation = "" },
		"control in operation":   func(p *storeapi.ClaimParams) { p.Scope.Operation = "POST\n/orders" },
		"empty key":              func(p *storeapi.ClaimParams) { p.Scope.Key = "" },
		"key of 256 bytes":       func(p *storeapi.ClaimParams) { p.Scope.Key = strings.Repeat("k", 256) },
		"key with a newline":     func(p *storeapi.ClaimParams) { p.Scope.Key = "key\n" },
		"key not ASCII":          func(p *storeapi.ClaimParams) { p.Scope.Key = "clé" },
		"key with DEL":           func(p *storeapi.ClaimParams) { p.Scope.Key = "key\x7f" },
		"empty fingerprint":      func(p *storeapi.ClaimParams) { p.Fingerprint = "" },
		"fingerprint too long":   func(p *storeapi.ClaimParams) { p.Fingerprint = strings.Repeat("f", 257) },
		"nil owner":              func(p *storeapi.ClaimParams) { p.Owner = uuid.Nil },
		"zero lease":             func(p *storeapi.ClaimParams) { p.Lease = 0 },
		"lease under 1ms":        func(p *storeapi.ClaimParams) { p.Lease = time.Millisecond - 1 },
		"negative retention":     func(p *storeapi.ClaimParams) { p.Retention = -time.Second },
		"zero retention":         func(p *storeapi.ClaimParams) { p.Retention = 0 },
		"proposal out of range":  func(p *storeapi.ClaimParams) { p.Proposed = 1<<62 + 1 },
		"proposal at the uint64": func(p *storeapi.ClaimParams) { p.Proposed = ^uint64(0) },
	}
	for name, mutate := range cases {
		p := base
		mutate(&p)
		res, err := s.Claim(ctx, noTx[TTx](), p)
		if !errors.Is(err, durable.ErrInvalidScope) || res.Acquired {
			t.Errorf("Claim with %s = %+v, %v; want ErrInvalidScope", name, res, err)
		}
		if !invalidArgument.MatchString(err.Error()) {
			t.Errorf("Claim with %s: %v does not say which field is invalid and why", name, err)
		}
		err = s.InTx(ctx, func(ctx context.Context, tx TTx) error {
			_, err := s.Claim(ctx, tx, p)
			return err
		})
		if !errors.Is(err, durable.ErrInvalidScope) {
			t.Errorf("Claim in tx with %s = %v; want ErrInvalidScope", name, err)
		}
		if p.Scope.Validate() != nil {
			if _, err := s.Ref(p.Scope); !errors.Is(err, durable.ErrInvalidScope) {
				t.Errorf("Ref with %s = %v; want ErrInvalidScope", name, err)
			}
		}
	}
	ref := mustRef(t, s, base.Scope)
	_, err := s.Adopt(ctx, ref, uuid.Nil, 0, long)
	wantErr(t, "Adopt with a nil owner", err, durable.ErrInvalidScope)
	_, err = s.Adopt(ctx, ref, uuid.New(), 0, 0)
	wantErr(t, "Adopt with a zero lease", err, durable.ErrInvalidScope)
	wantErr(t, "Renew with a zero lease", s.Renew(ctx, ref, fence.Token{Generation: 1, Owner: uuid.New()}, 0), durable.ErrInvalidScope)
	_, err = s.Pending(ctx, 0, 0)
	wantErr(t, "Pending with limit 0", err, durable.ErrInvalidScope)

	mustNotFound(t, s, ref)
	st, err := s.Stats(ctx)
	must(t, "Stats", err)
	var total int64
	for _, n := range st.ByState {
		total += n
	}
	if total != 0 || st.Released != 0 {
		t.Fatalf("invalid calls wrote records: %+v", st)
	}
}
