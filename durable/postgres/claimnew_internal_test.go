package postgres

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// A claim with ExpectNew (Redis has just granted the key) sends the plain
// insert alone when the scope has no record, and the insert then the full
// claim when it has one (Redis lost it); without the hint, the full claim
// alone, so a replay the database answers stays one statement. The
// outcomes are the store contract's (TestContractExpectNew); this test
// pins what each path sends, which is what the hint is for.
func TestClaimNewStatements(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	params := func(key string, expectNew bool) storeapi.ClaimParams {
		return storeapi.ClaimParams{Scope: durable.Scope{Tenant: "tenant", Operation: "POST /orders", Key: key},
			Fingerprint: "v1:fp", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour,
			Proposed: 5, ExpectNew: expectNew}
	}
	names := func(sql []string) []string {
		n := make([]string, len(sql))
		for i, q := range sql {
			switch q {
			case s.q.claimNew:
				n[i] = "the insert (claimNewSQL)"
			case s.q.claim:
				n[i] = "the full claim (claimSQL)"
			default:
				n[i] = strings.Join(strings.Fields(q), " ")
			}
		}
		return n
	}
	claim := func(what string, p storeapi.ClaimParams, acquired bool, want ...string) storeapi.ClaimResult {
		t.Helper()
		s.rec.reset()
		res, err := s.Claim(ctx, nil, p)
		if err != nil || res.Acquired != acquired {
			t.Fatalf("%s: Claim = %+v, %v; want acquired %v", what, res, err, acquired)
		}
		if got := s.rec.take(); !slices.Equal(got, want) {
			t.Fatalf("%s sent %v; want %v", what, names(got), names(want))
		}
		return res
	}

	fresh := claim("a fresh key with the hint", params("k-new", true), true, s.q.claimNew)
	if fresh.Token.Generation < 5 || fresh.Takeover || fresh.Restarted {
		t.Fatalf("insert-first claim = %+v; want a fresh record at generation ≥ 5", fresh)
	}
	claim("a fresh key without the hint", params("k-plain", false), true, s.q.claim)

	// A finished record: the hint is wrong (Redis lost the record), the
	// insert inserts nothing, and the full claim replays it.
	p := params("k-done", false)
	res := claim("the first claim", p, true, s.q.claim)
	if err := s.Complete(ctx, nil, res.Ref, res.Token, durable.Result{StatusCode: 201, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for _, hint := range []bool{true, false} {
		want := []string{s.q.claim}
		if hint {
			want = []string{s.q.claimNew, s.q.claim}
		}
		p := params("k-done", hint)
		rep := claim("a replay", p, false, want...)
		if rep.Record == nil || rep.Record.State != durable.Completed || string(rep.Record.Result.Body) != `{}` {
			t.Fatalf("replay with hint %v = %+v; want the completed record", hint, rep.Record)
		}
	}

	// A live lease: the insert inserts nothing and takes no lock; the full
	// claim answers busy with the holder's record.
	held := claim("the holder's claim", params("k-held", true), true, s.q.claimNew)
	busy := claim("a duplicate while held", params("k-held", true), false, s.q.claimNew, s.q.claim)
	if busy.Record == nil || busy.Record.State != durable.Processing || busy.Record.Token != held.Token {
		t.Fatalf("duplicate = %+v; want the holder's processing record", busy.Record)
	}
	if err := s.Complete(ctx, nil, held.Ref, held.Token, durable.Result{StatusCode: 200}); err != nil {
		t.Fatalf("the holder completes after the duplicate's insert: %v", err)
	}
}

// take returns the statements recorded since the last reset or take.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sql
	r.sql = nil
	return s
}
