package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/headers"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/sqlite"
	"github.com/oncekey/oncekey/fence"
)

// open returns a fresh, migrated store in its own file.
func open(t testing.TB, opts ...sqlite.Option) *sqlite.Store {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "oncekey.db"), opts...)
}

func openAt(t testing.TB, path string, opts ...sqlite.Option) *sqlite.Store {
	t.Helper()
	s, err := sqlite.OpenStore(t.Context(), path, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

var scopeN struct {
	sync.Mutex
	n int
}

func newScope() durable.Scope {
	scopeN.Lock()
	defer scopeN.Unlock()
	scopeN.n++
	return durable.Scope{Tenant: "tenant-a", Operation: "POST /orders", Key: fmt.Sprintf("key-%d", scopeN.n)}
}

func params(sc durable.Scope, fp string) storeapi.ClaimParams {
	return storeapi.ClaimParams{
		Scope:       sc,
		Fingerprint: fp,
		Owner:       uuid.New(),
		Lease:       time.Minute,
		Retention:   time.Hour,
	}
}

// withLease returns p, its lease set to d.
func withLease(p storeapi.ClaimParams, d time.Duration) storeapi.ClaimParams {
	p.Lease = d
	return p
}

// withRetention returns p, its retention set to d.
func withRetention(p storeapi.ClaimParams, d time.Duration) storeapi.ClaimParams {
	p.Retention = d
	return p
}

func mustClaim(t testing.TB, s *sqlite.Store, p storeapi.ClaimParams) storeapi.ClaimResult {
	t.Helper()
	r, err := s.Claim(t.Context(), nil, p)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return r
}

func mustGet(t testing.TB, s *sqlite.Store, ref durable.Ref) durable.Record {
	t.Helper()
	rec, err := s.Get(t.Context(), ref)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return rec
}

// waitUntil polls cond until it holds, failing the test after a generous
// bound; it asserts nothing about how long that took.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for range 5000 {
		if cond() {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("timed out waiting until %s", what)
}

func waitLeaseExpired(t testing.TB, s *sqlite.Store, ref durable.Ref) {
	t.Helper()
	waitUntil(t, "the lease expired", func() bool { return mustGet(t, s, ref).LeaseRemaining == 0 })
}

// waitSweepable polls until the database's clock (ExpiresAt - ExpiresIn)
// passed the record's generation by the sweep margin of two minutes.
func waitSweepable(t testing.TB, s *sqlite.Store, ref durable.Ref) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		rec := mustGet(t, s, ref)
		if int64(rec.Token.Generation) < rec.ExpiresAt.Add(-rec.ExpiresIn).UnixMilli()-120_000 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the clock never passed generation %d by the sweep margin", rec.Token.Generation)
		}
	}
}

func waitRetentionPassed(t testing.TB, s *sqlite.Store, ref durable.Ref) {
	t.Helper()
	waitUntil(t, "the retention passed", func() bool { return mustGet(t, s, ref).ExpiresIn <= 0 })
}

var okResult = durable.Result{
	StatusCode: 201,
	Headers:    map[string][]string{"Content-Type": {"application/json"}},
	Body:       []byte(`{"id":"o_1"}`),
	Version:    1,
	ResourceID: "o_1",
}

func TestStore_Claim(t *testing.T) {
	t.Parallel()
	s := open(t)

	t.Run("FirstClaimAcquiresAtTheClockFloor", func(t *testing.T) {
		p := params(newScope(), "v1:a")
		r := mustClaim(t, s, p)
		if !r.Acquired || r.Takeover || r.Restarted || r.Token.Owner != p.Owner {
			t.Fatalf("got %+v", r)
		}
		rec := mustGet(t, s, r.Ref)
		// The database's clock in milliseconds minus 60 s, at creation.
		if want := uint64(rec.CreatedAt.UnixMilli() - 60_000); r.Token.Generation != want {
			t.Fatalf("generation %d, want the clock floor %d", r.Token.Generation, want)
		}
		if rec.State != durable.Processing || rec.Token != r.Token || rec.LeaseRemaining <= 0 || rec.ExpiresIn <= 0 {
			t.Fatalf("record %+v", rec)
		}
		if rec.ExpiresAt.Sub(rec.CreatedAt) != time.Hour {
			t.Fatalf("retention %v", rec.ExpiresAt.Sub(rec.CreatedAt))
		}
	})

	t.Run("ProposedGenerationAboveStoredIsKept", func(t *testing.T) {
		floor := mustClaim(t, s, params(newScope(), "v1:a")).Token.Generation
		p := params(newScope(), "v1:a")
		p.Proposed = floor + 1_000_041 // above the clock floor
		if r := mustClaim(t, s, p); r.Token.Generation != p.Proposed {
			t.Fatalf("generation %d, want %d", r.Token.Generation, p.Proposed)
		}
		p = params(newScope(), "v1:a")
		p.Proposed = 41 // below the clock floor
		if r := mustClaim(t, s, p); r.Token.Generation < floor {
			t.Fatalf("generation %d, want at least the clock floor %d", r.Token.Generation, floor)
		}
	})

	t.Run("SecondCallerSeesInProgress", func(t *testing.T) {
		sc := newScope()
		first := mustClaim(t, s, params(sc, "v1:a"))
		r := mustClaim(t, s, params(sc, "v1:a"))
		if r.Acquired || r.Record == nil || r.Record.State != durable.Processing || r.Record.Token != first.Token {
			t.Fatalf("got %+v", r)
		}
		if r.Record.LeaseRemaining <= 0 {
			t.Fatalf("lease remaining %v", r.Record.LeaseRemaining)
		}
	})

	t.Run("DifferentFingerprintIsMismatch", func(t *testing.T) {
		sc := newScope()
		mustClaim(t, s, params(sc, "v1:a"))
		_, err := s.Claim(t.Context(), nil, params(sc, "v1:b"))
		if !errors.Is(err, durable.ErrMismatch) {
			t.Fatalf("err %v, want ErrMismatch", err)
		}
	})

	t.Run("ExpiredLeaseIsTakenOverWithHigherGeneration", func(t *testing.T) {
		sc := newScope()
		first := mustClaim(t, s, withLease(params(sc, "v1:a"), 20*time.Millisecond))
		created := mustGet(t, s, first.Ref).CreatedAt
		waitLeaseExpired(t, s, first.Ref)

		// A different request may not take it over.
		if _, err := s.Claim(t.Context(), nil, params(sc, "v1:other")); !errors.Is(err, durable.ErrMismatch) {
			t.Fatalf("err %v, want ErrMismatch", err)
		}
		second := mustClaim(t, s, params(sc, "v1:a"))
		if !second.Acquired || !second.Takeover || second.Restarted || second.Token.Generation != first.Token.Generation+1 {
			t.Fatalf("got %+v", second)
		}
		rec := mustGet(t, s, first.Ref)
		if rec.Takeovers != 1 || !rec.CreatedAt.Equal(created) || rec.Token != second.Token {
			t.Fatalf("record %+v", rec)
		}
		// The stale owner is fenced everywhere.
		for name, err := range map[string]error{
			"complete":  s.Complete(t.Context(), nil, first.Ref, first.Token, okResult),
			"fail":      s.Fail(t.Context(), nil, first.Ref, first.Token, okResult),
			"uncertain": s.MarkUncertain(t.Context(), first.Ref, first.Token),
			"renew":     s.Renew(t.Context(), first.Ref, first.Token, time.Minute),
			"release":   s.Release(t.Context(), nil, first.Ref, first.Token),
		} {
			if !errors.Is(err, durable.ErrFenced) {
				t.Errorf("%s by the stale owner: %v, want ErrFenced", name, err)
			}
		}
		if err := s.Complete(t.Context(), nil, second.Ref, second.Token, okResult); err != nil {
			t.Fatalf("Complete by the new owner: %v", err)
		}
	})

	t.Run("TakeoverKeepsGreatestGeneration", func(t *testing.T) {
		sc := newScope()
		first := mustClaim(t, s, withLease(params(sc, "v1:a"), 10*time.Millisecond))
		waitLeaseExpired(t, s, first.Ref)
		p2 := params(sc, "v1:a")
		p2.Proposed = 3 // a Redis that lost data proposes a lower one
		if r := mustClaim(t, s, p2); r.Token.Generation != first.Token.Generation+1 {
			t.Fatalf("generation %d, want %d", r.Token.Generation, first.Token.Generation+1)
		}
	})

	t.Run("CompletedIsReplayed", func(t *testing.T) {
		sc := newScope()
		first := mustClaim(t, s, params(sc, "v1:a"))
		if err := s.Complete(t.Context(), nil, first.Ref, first.Token, okResult); err != nil {
			t.Fatal(err)
		}
		r := mustClaim(t, s, params(sc, "v1:a"))
		if r.Acquired || r.Record == nil || r.Record.State != durable.Completed {
			t.Fatalf("got %+v", r)
		}
		got := r.Record.Result
		if got == nil || got.StatusCode != 201 || string(got.Body) != string(okResult.Body) ||
			got.Headers["Content-Type"][0] != "application/json" || got.Version != 1 || got.ResourceID != "o_1" {
			t.Fatalf("result %+v", got)
		}
		if r.Record.CompletedAt.IsZero() || r.Record.LeaseRemaining != 0 {
			t.Fatalf("record %+v", r.Record)
		}
	})

	t.Run("FailedIsReplayedWithEmptyBody", func(t *testing.T) {
		sc := newScope()
		first := mustClaim(t, s, params(sc, "v1:a"))
		if err := s.Fail(t.Context(), nil, first.Ref, first.Token, durable.Result{StatusCode: 402}); err != nil {
			t.Fatal(err)
		}
		r := mustClaim(t, s, params(sc, "v1:a"))
		if r.Record == nil || r.Record.State != durable.Failed || r.Record.Result.StatusCode != 402 ||
			r.Record.Result.Body == nil || len(r.Record.Result.Body) != 0 {
			t.Fatalf("got %+v", r.Record)
		}
	})

	t.Run("ReleasedRecordIsClaimedAgainWithHigherGeneration", func(t *testing.T) {
		sc := newScope()
		first := mustClaim(t, s, params(sc, "v1:a"))
		if err := s.Release(t.Context(), nil, first.Ref, first.Token); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(t.Context(), nil, first.Ref, first.Token); err != nil {
			t.Fatalf("second Release: %v", err)
		}
		rec := mustGet(t, s, first.Ref)
		if !rec.Released || rec.Token.Owner != uuid.Nil || rec.Token.Generation != first.Token.Generation {
			t.Fatalf("record %+v", rec)
		}
		r := mustClaim(t, s, params(sc, "v1:another-request"))
		if !r.Acquired || !r.Restarted || r.Takeover || r.Token.Generation <= first.Token.Generation {
			t.Fatalf("got %+v", r)
		}
		if err := s.Release(t.Context(), nil, first.Ref, first.Token); !errors.Is(err, durable.ErrFenced) {
			t.Fatalf("Release after a new claim: %v, want ErrFenced", err)
		}
	})

	t.Run("FinishedRecordPastRetentionRestartsAsNewOperation", func(t *testing.T) {
		sc := newScope()
		first := mustClaim(t, s, withRetention(params(sc, "v1:a"), 20*time.Millisecond))
		if err := s.Complete(t.Context(), nil, first.Ref, first.Token, okResult); err != nil {
			t.Fatal(err)
		}
		waitRetentionPassed(t, s, first.Ref)
		r := mustClaim(t, s, params(sc, "v1:b"))
		if !r.Acquired || !r.Restarted || r.Token.Generation <= first.Token.Generation {
			t.Fatalf("got %+v", r)
		}
		rec := mustGet(t, s, r.Ref)
		if rec.State != durable.Processing || rec.Result != nil || rec.Fingerprint != "v1:b" || rec.ExpiresIn <= 0 {
			t.Fatalf("record %+v", rec)
		}
	})

	t.Run("ProcessingPastRetentionIsNeverRestarted", func(t *testing.T) {
		sc := newScope()
		first := mustClaim(t, s, withRetention(params(sc, "v1:a"), 10*time.Millisecond))
		waitRetentionPassed(t, s, first.Ref)
		if _, err := s.Claim(t.Context(), nil, params(sc, "v1:b")); !errors.Is(err, durable.ErrMismatch) {
			t.Fatalf("err %v, want ErrMismatch", err)
		}
		r := mustClaim(t, s, params(sc, "v1:a"))
		if r.Acquired {
			t.Fatalf("acquired a live lease past retention: %+v", r)
		}
	})

	t.Run("UncertainIsNotAcquired", func(t *testing.T) {
		sc := newScope()
		p := params(sc, "v1:a")
		first := mustClaim(t, s, p)
		if err := s.MarkUncertain(t.Context(), first.Ref, first.Token); err != nil {
			t.Fatal(err)
		}
		r := mustClaim(t, s, params(sc, "v1:a"))
		if r.Acquired || r.Record == nil || r.Record.State != durable.Uncertain {
			t.Fatalf("got %+v", r)
		}
	})

	t.Run("InvalidParamsWriteNothing", func(t *testing.T) {
		sc := newScope()
		for name, mod := range map[string]func(*storeapi.ClaimParams){
			"tenant":      func(p *storeapi.ClaimParams) { p.Scope.Tenant = "" },
			"operation":   func(p *storeapi.ClaimParams) { p.Scope.Operation = "" },
			"key":         func(p *storeapi.ClaimParams) { p.Scope.Key = "bad\nkey" },
			"fingerprint": func(p *storeapi.ClaimParams) { p.Fingerprint = "" },
			"owner":       func(p *storeapi.ClaimParams) { p.Owner = uuid.Nil },
			"lease":       func(p *storeapi.ClaimParams) { p.Lease = 0 },
			"retention":   func(p *storeapi.ClaimParams) { p.Retention = time.Microsecond },
			"proposed":    func(p *storeapi.ClaimParams) { p.Proposed = 1<<62 + 1 },
		} {
			p := params(sc, "v1:a")
			mod(&p)
			_, err := s.Claim(t.Context(), nil, p)
			if !errors.Is(err, durable.ErrInvalidScope) || !strings.Contains(err.Error(), "durable: invalid "+name+": ") {
				t.Errorf("%s: %v", name, err)
			}
		}
		ref, _ := s.Ref(sc)
		if _, err := s.Get(t.Context(), ref); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("Get: %v, want ErrNotFound", err)
		}
	})
}

func TestStore_FencedWrites(t *testing.T) {
	t.Parallel()
	s := open(t)

	t.Run("CompleteTwiceWithSameTokenSucceeds", func(t *testing.T) {
		r := mustClaim(t, s, params(newScope(), "v1:a"))
		for i := range 2 {
			if err := s.Complete(t.Context(), nil, r.Ref, r.Token, okResult); err != nil {
				t.Fatalf("Complete #%d: %v", i+1, err)
			}
		}
		other := okResult
		other.Body = []byte(`{"id":"o_2"}`)
		if err := s.Complete(t.Context(), nil, r.Ref, r.Token, other); !errors.Is(err, durable.ErrFenced) {
			t.Fatalf("Complete with another result: %v, want ErrFenced", err)
		}
		if err := s.Fail(t.Context(), nil, r.Ref, r.Token, okResult); !errors.Is(err, durable.ErrFenced) {
			t.Fatalf("Fail after Complete: %v, want ErrFenced", err)
		}
	})

	t.Run("WrongOwnerOrGenerationIsFenced", func(t *testing.T) {
		r := mustClaim(t, s, params(newScope(), "v1:a"))
		for _, tok := range []fence.Token{
			{Generation: r.Token.Generation, Owner: uuid.New()},
			{Generation: r.Token.Generation + 1, Owner: r.Token.Owner},
		} {
			if err := s.Complete(t.Context(), nil, r.Ref, tok, okResult); !errors.Is(err, durable.ErrFenced) {
				t.Fatalf("Complete with %v: %v, want ErrFenced", tok, err)
			}
		}
		if rec := mustGet(t, s, r.Ref); rec.State != durable.Processing {
			t.Fatalf("state %s", rec.State)
		}
	})

	t.Run("WriteOnMissingRecordIsFenced", func(t *testing.T) {
		ref, _ := s.Ref(newScope())
		tok := fence.Token{Generation: 1, Owner: uuid.New()}
		if err := s.Complete(t.Context(), nil, ref, tok, okResult); !errors.Is(err, durable.ErrFenced) {
			t.Fatalf("err %v, want ErrFenced", err)
		}
	})

	t.Run("ZeroTokenIsFenced", func(t *testing.T) {
		r := mustClaim(t, s, params(newScope(), "v1:a"))
		if err := s.Complete(t.Context(), nil, r.Ref, fence.Token{}, okResult); !errors.Is(err, durable.ErrFenced) {
			t.Fatalf("err %v, want ErrFenced", err)
		}
	})

	t.Run("RenewExtendsOnlyForTheOwner", func(t *testing.T) {
		r := mustClaim(t, s, withLease(params(newScope(), "v1:a"), 30*time.Millisecond))
		if err := s.Renew(t.Context(), r.Ref, r.Token, time.Hour); err != nil {
			t.Fatal(err)
		}
		if rem := mustGet(t, s, r.Ref).LeaseRemaining; rem <= time.Minute {
			t.Fatalf("lease remaining %v after renewing for an hour", rem)
		}
		if err := s.Renew(t.Context(), r.Ref, fence.Token{Generation: r.Token.Generation, Owner: uuid.New()}, time.Hour); !errors.Is(err, durable.ErrFenced) {
			t.Fatalf("Renew by another owner: %v", err)
		}
		if err := s.Renew(t.Context(), r.Ref, r.Token, 0); !errors.Is(err, durable.ErrInvalidScope) {
			t.Fatalf("Renew with zero lease: %v", err)
		}
	})

	t.Run("UncertainIsAdoptedCompletedAndOriginalFenced", func(t *testing.T) {
		r := mustClaim(t, s, params(newScope(), "v1:a"))
		if err := s.MarkUncertain(t.Context(), r.Ref, r.Token); err != nil {
			t.Fatal(err)
		}
		if err := s.MarkUncertain(t.Context(), r.Ref, r.Token); err != nil {
			t.Fatalf("second MarkUncertain: %v", err)
		}
		rec := mustGet(t, s, r.Ref)
		if rec.State != durable.Uncertain || rec.LeaseRemaining != 0 {
			t.Fatalf("record %+v", rec)
		}
		if err := s.Renew(t.Context(), r.Ref, r.Token, time.Hour); !errors.Is(err, durable.ErrFenced) {
			t.Fatalf("Renew of an unadopted uncertain record: %v", err)
		}
		pend, err := s.Pending(t.Context(), 0, 1000)
		if err != nil || !containsRef(pend, r.Ref) {
			t.Fatalf("Pending: %v, %d records", err, len(pend))
		}
		adopter := uuid.New()
		tok, err := s.Adopt(t.Context(), r.Ref, adopter, 0, time.Minute)
		if err != nil || tok.Generation != r.Token.Generation+1 || tok.Owner != adopter {
			t.Fatalf("Adopt: %v %v", tok, err)
		}
		if _, err := s.Adopt(t.Context(), r.Ref, uuid.New(), 0, time.Minute); !errors.Is(err, durable.ErrBusy) {
			t.Fatalf("second Adopt: %v, want ErrBusy", err)
		}
		if rec := mustGet(t, s, r.Ref); rec.State != durable.Uncertain || rec.Takeovers != 1 {
			t.Fatalf("adopted record %+v", rec)
		}
		if err := s.Renew(t.Context(), r.Ref, tok, time.Minute); err != nil {
			t.Fatalf("Renew by the adopter: %v", err)
		}
		if err := s.Complete(t.Context(), nil, r.Ref, r.Token, okResult); !errors.Is(err, durable.ErrFenced) {
			t.Fatalf("Complete by the original owner: %v, want ErrFenced", err)
		}
		if err := s.Complete(t.Context(), nil, r.Ref, tok, okResult); err != nil {
			t.Fatalf("Complete by the adopter: %v", err)
		}
		if _, err := s.Adopt(t.Context(), r.Ref, uuid.New(), 0, time.Minute); !errors.Is(err, durable.ErrBusy) {
			t.Fatalf("Adopt of a completed record: %v, want ErrBusy", err)
		}
	})

	t.Run("AdoptOfLiveLeaseIsBusyAndOfNothingNotFound", func(t *testing.T) {
		r := mustClaim(t, s, params(newScope(), "v1:a"))
		if _, err := s.Adopt(t.Context(), r.Ref, uuid.New(), 0, time.Minute); !errors.Is(err, durable.ErrBusy) {
			t.Fatalf("err %v, want ErrBusy", err)
		}
		ref, _ := s.Ref(newScope())
		if _, err := s.Adopt(t.Context(), ref, uuid.New(), 0, time.Minute); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("err %v, want ErrNotFound", err)
		}
	})

	t.Run("AdoptOfExpiredProcessingKeepsStateAndRaisesGeneration", func(t *testing.T) {
		r := mustClaim(t, s, withLease(params(newScope(), "v1:a"), 10*time.Millisecond))
		waitLeaseExpired(t, s, r.Ref)
		tok, err := s.Adopt(t.Context(), r.Ref, uuid.New(), r.Token.Generation+7, time.Minute)
		if err != nil || tok.Generation != r.Token.Generation+7 {
			t.Fatalf("Adopt: %v %v", tok, err)
		}
		if rec := mustGet(t, s, r.Ref); rec.State != durable.Processing || rec.Token != tok {
			t.Fatalf("record %+v", rec)
		}
	})
}

func containsRef(recs []durable.Record, ref durable.Ref) bool {
	for _, r := range recs {
		if r.Ref == ref {
			return true
		}
	}
	return false
}

func TestStore_PendingSweepStats(t *testing.T) {
	t.Parallel()
	s := open(t)
	ctx := t.Context()
	short := func(fp string) storeapi.ClaimParams {
		p := params(newScope(), fp)
		p.Lease, p.Retention = 10*time.Millisecond, 20*time.Millisecond
		return p
	}
	done := mustClaim(t, s, short("v1:done"))
	if err := s.Complete(ctx, nil, done.Ref, done.Token, okResult); err != nil {
		t.Fatal(err)
	}
	released := mustClaim(t, s, short("v1:released"))
	if err := s.Release(ctx, nil, released.Ref, released.Token); err != nil {
		t.Fatal(err)
	}
	stale := mustClaim(t, s, short("v1:stale"))
	uncertain := mustClaim(t, s, short("v1:uncertain"))
	if err := s.MarkUncertain(ctx, uncertain.Ref, uncertain.Token); err != nil {
		t.Fatal(err)
	}
	live := mustClaim(t, s, params(newScope(), "v1:live"))
	for _, ref := range []durable.Ref{done.Ref, released.Ref, stale.Ref, uncertain.Ref} {
		waitRetentionPassed(t, s, ref)
	}
	// Sweep holds a record back until the database's clock passed its
	// generation by two minutes (about a minute after its creation).
	if n, err := s.Sweep(ctx, 100); err != nil || n != 0 {
		t.Fatalf("Sweep within the generation margin = %d, %v; want 0", n, err)
	}
	waitLeaseExpired(t, s, stale.Ref)

	pend, err := s.Pending(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(pend) != 2 || pend[0].Ref != stale.Ref || pend[1].Ref != uncertain.Ref {
		t.Fatalf("Pending: %d records", len(pend))
	}
	if pend, _ := s.Pending(ctx, time.Hour, 10); len(pend) != 1 || pend[0].Ref != uncertain.Ref {
		t.Fatalf("Pending stale for an hour: %d records", len(pend))
	}
	if pend, _ := s.Pending(ctx, 0, 1); len(pend) != 1 {
		t.Fatalf("Pending limit 1: %d records", len(pend))
	}
	if _, err := s.Pending(ctx, 0, 0); !errors.Is(err, durable.ErrInvalidScope) {
		t.Fatalf("Pending limit 0: %v", err)
	}

	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[durable.State]int64{durable.Processing: 2, durable.Completed: 1, durable.Failed: 0, durable.Uncertain: 1}
	for k, v := range want {
		if st.ByState[k] != v {
			t.Errorf("ByState[%s] = %d, want %d", k, st.ByState[k], v)
		}
	}
	if st.Released != 1 || st.StaleProcessing != 1 || st.ExpiredUnswept != 2 || st.ExpiredStuck != 2 || st.OldestUnexpiredAge <= 0 {
		t.Fatalf("stats %+v", st)
	}

	for _, ref := range []durable.Ref{done.Ref, released.Ref} {
		waitSweepable(t, s, ref)
	}
	if _, err := s.Sweep(ctx, 0); !errors.Is(err, durable.ErrInvalidScope) {
		t.Fatalf("Sweep(0): %v", err)
	}
	if n, err := s.Sweep(ctx, 1); err != nil || n != 1 {
		t.Fatalf("Sweep(1) = %d, %v", n, err)
	}
	if n, err := s.Sweep(ctx, 100); err != nil || n != 1 {
		t.Fatalf("Sweep(100) = %d, %v", n, err)
	}
	if n, err := s.Sweep(ctx, 100); err != nil || n != 0 {
		t.Fatalf("third Sweep = %d, %v", n, err)
	}
	for _, ref := range []durable.Ref{done.Ref, released.Ref} {
		if _, err := s.Get(ctx, ref); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("swept record: %v", err)
		}
	}
	for _, ref := range []durable.Ref{stale.Ref, uncertain.Ref, live.Ref} {
		mustGet(t, s, ref)
	}
	st, _ = s.Stats(ctx)
	if st.ExpiredUnswept != 0 || st.ExpiredStuck != 2 || st.Released != 0 {
		t.Fatalf("stats after sweep %+v", st)
	}
}

func TestStore_Concurrency(t *testing.T) {
	t.Parallel()

	t.Run("SixtyFourClaimersOfOneScopeOneAcquires", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		sc := newScope()
		var wg sync.WaitGroup
		results := make([]storeapi.ClaimResult, 64)
		errs := make([]error, 64)
		start := make(chan struct{})
		for i := range 64 {
			wg.Go(func() {
				<-start
				results[i], errs[i] = s.Claim(t.Context(), nil, params(sc, "v1:a"))
			})
		}
		close(start)
		wg.Wait()
		acquired := 0
		for i, r := range results {
			if errs[i] != nil {
				t.Fatalf("claim %d: %v", i, errs[i])
			}
			if r.Acquired {
				acquired++
			} else if r.Record == nil || r.Record.State != durable.Processing {
				t.Fatalf("claim %d: %+v", i, r)
			}
		}
		if acquired != 1 {
			t.Fatalf("%d acquired, want 1", acquired)
		}
	})

	t.Run("ManyClaimersOfManyScopesAllAcquire", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		const workers, each = 16, 8
		var wg sync.WaitGroup
		errs := make(chan error, workers*each)
		for range workers {
			wg.Go(func() {
				for range each {
					p := params(newScope(), "v1:a")
					r, err := s.Claim(t.Context(), nil, p)
					if err == nil && !r.Acquired {
						err = fmt.Errorf("not acquired: %+v", r)
					}
					if err == nil {
						err = s.Complete(t.Context(), nil, r.Ref, r.Token, okResult)
					}
					if err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		st, err := s.Stats(t.Context())
		if err != nil || st.ByState[durable.Completed] != workers*each {
			t.Fatalf("stats %+v %v", st, err)
		}
	})

	t.Run("TwoStoresOnOneFileAcquireEachScopeOnce", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "shared.db")
		stores := []*sqlite.Store{openAt(t, path), openAt(t, path)}
		scopes := make([]durable.Scope, 40)
		for i := range scopes {
			scopes[i] = newScope()
		}
		var mu sync.Mutex
		acquired := map[durable.Scope]int{}
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				s := stores[w%2]
				for _, sc := range scopes {
					r, err := s.Claim(t.Context(), nil, params(sc, "v1:a"))
					if err != nil {
						t.Error(err)
						return
					}
					if r.Acquired {
						mu.Lock()
						acquired[sc]++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		for _, sc := range scopes {
			if acquired[sc] != 1 {
				t.Fatalf("scope acquired %d times", acquired[sc])
			}
		}
	})
}

func TestStore_InTx(t *testing.T) {
	t.Parallel()
	s := open(t)
	ctx := t.Context()
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	countOrders := func() int {
		var n int
		if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// do is claim.Do's shape: claim, business write and completion in one
	// transaction.
	do := func(sc durable.Scope, id string, fail error) (storeapi.ClaimResult, error) {
		var out storeapi.ClaimResult
		err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			r, err := s.Claim(ctx, tx, params(sc, "v1:order"))
			if err != nil || !r.Acquired {
				out = r
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES (?, ?)`, id, "book"); err != nil {
				return err
			}
			if fail != nil {
				return fail
			}
			res := okResult
			res.ResourceID = id
			out = r
			return s.Complete(ctx, tx, r.Ref, r.Token, res)
		})
		return out, err
	}

	t.Run("OrderAndCompletionCommitTogether", func(t *testing.T) {
		sc := newScope()
		before := countOrders()
		r, err := do(sc, "o-commit", nil)
		if err != nil || !r.Acquired {
			t.Fatalf("do: %+v %v", r, err)
		}
		if countOrders() != before+1 {
			t.Fatal("order not committed")
		}
		rec := mustGet(t, s, r.Ref)
		if rec.State != durable.Completed || rec.Result.ResourceID != "o-commit" {
			t.Fatalf("record %+v", rec)
		}
		again, err := do(sc, "o-commit-2", nil)
		if err != nil || again.Acquired || again.Record == nil || again.Record.State != durable.Completed {
			t.Fatalf("retry: %+v %v", again, err)
		}
		if countOrders() != before+1 {
			t.Fatal("retry inserted a second order")
		}
	})

	t.Run("FailureRollsBackClaimAndOrder", func(t *testing.T) {
		sc := newScope()
		before := countOrders()
		boom := errors.New("boom")
		if _, err := do(sc, "o-rollback", boom); !errors.Is(err, boom) {
			t.Fatalf("err %v, want boom", err)
		}
		ref, _ := s.Ref(sc)
		if _, err := s.Get(ctx, ref); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("Get after rollback: %v", err)
		}
		if countOrders() != before {
			t.Fatal("order survived the rollback")
		}
	})

	t.Run("PanicRollsBackAndRepanics", func(t *testing.T) {
		sc := newScope()
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			_ = s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				if _, err := s.Claim(ctx, tx, params(sc, "v1:order")); err != nil {
					return err
				}
				panic("handler bug")
			})
		}()
		ref, _ := s.Ref(sc)
		if _, err := s.Get(ctx, ref); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("Get after panic: %v", err)
		}
		// The write lock was released.
		mustClaim(t, s, params(sc, "v1:order"))
	})

	t.Run("ConcurrentDuplicatesInsertOneOrder", func(t *testing.T) {
		sc := newScope()
		before := countOrders()
		var wg sync.WaitGroup
		var mu sync.Mutex
		acquired := 0
		for i := range 16 {
			wg.Go(func() {
				r, err := do(sc, fmt.Sprintf("o-dup-%d", i), nil)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Acquired {
					mu.Lock()
					acquired++
					mu.Unlock()
				} else if r.Record == nil || r.Record.State != durable.Completed {
					t.Errorf("duplicate saw %+v, want the completed record", r.Record)
				}
			})
		}
		wg.Wait()
		if acquired != 1 || countOrders() != before+1 {
			t.Fatalf("acquired %d, orders %d", acquired, countOrders()-before)
		}
	})

	t.Run("ClaimerWaitsForOpenTransactionThenSeesCommit", func(t *testing.T) {
		sc := newScope()
		claimed := make(chan struct{})
		release := make(chan struct{})
		var txErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			txErr = s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				r, err := s.Claim(ctx, tx, params(sc, "v1:order"))
				if err != nil {
					return err
				}
				close(claimed)
				<-release
				return s.Complete(ctx, tx, r.Ref, r.Token, okResult)
			})
		})
		<-claimed
		got := make(chan storeapi.ClaimResult, 1)
		wg.Go(func() {
			r, err := s.Claim(ctx, nil, params(sc, "v1:order"))
			if err != nil {
				t.Error(err)
			}
			got <- r
		})
		// While the transaction is open nothing is visible to readers.
		ref, _ := s.Ref(sc)
		if _, err := s.Get(ctx, ref); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("Get during the transaction: %v", err)
		}
		close(release)
		wg.Wait()
		if txErr != nil {
			t.Fatal(txErr)
		}
		r := <-got
		if r.Acquired || r.Record == nil || r.Record.State != durable.Completed {
			t.Fatalf("second claimer got %+v, want the completed record", r)
		}
	})

	t.Run("NonTxWriteInsideTxFailsAfterBusyTimeout", func(t *testing.T) {
		s := open(t, sqlite.WithBusyTimeout(20*time.Millisecond))
		err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := s.Claim(ctx, nil, params(newScope(), "v1:a"))
			return err
		})
		if !errors.Is(err, durable.ErrUnavailable) || !strings.Contains(err.Error(), "timed out waiting for the write lock") {
			t.Fatalf("err %v, want ErrUnavailable for the write lock's timeout", err)
		}
	})

	t.Run("OtherStoreWaitsThenFailsWithUnavailable", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "busy.db")
		a := openAt(t, path)
		b := openAt(t, path, sqlite.WithBusyTimeout(20*time.Millisecond))
		err := a.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := a.Claim(ctx, tx, params(newScope(), "v1:a")); err != nil {
				return err
			}
			_, err := b.Claim(ctx, nil, params(newScope(), "v1:a"))
			if !errors.Is(err, durable.ErrUnavailable) {
				t.Errorf("claim on the locked file: %v, want ErrUnavailable", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

func TestNew_CallersDB(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "callers.db")
	// A DSN with DEFERRED transactions: InTx must take the write lock first
	// so that two stores' transactions never fail upgrading their snapshot.
	mk := func() storeapi.Store[*sql.Tx] {
		db, err := sql.Open("sqlite3", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := sqlite.Migrate(t.Context(), db); err != nil {
			t.Fatal(err)
		}
		s, err := sqlite.New(db)
		if err != nil {
			t.Fatal(err)
		}
		return s.(storeapi.Store[*sql.Tx])
	}
	a, b := mk(), mk()
	sc := newScope()
	var wg sync.WaitGroup
	var mu sync.Mutex
	acquired := 0
	for i := range 16 {
		s := []storeapi.Store[*sql.Tx]{a, b}[i%2]
		wg.Go(func() {
			err := s.InTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
				// Read first, as a caller might: without the write lock taken
				// at the start this would be a deferred read snapshot.
				ref, _ := s.Ref(sc)
				var n int
				if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM idempotency_requests WHERE key_hash = ?`, ref.KeyHash[:]).Scan(&n); err != nil {
					return err
				}
				r, err := s.Claim(ctx, tx, params(sc, "v1:a"))
				if err != nil || !r.Acquired {
					return err
				}
				mu.Lock()
				acquired++
				mu.Unlock()
				return s.Complete(ctx, tx, r.Ref, r.Token, okResult)
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if acquired != 1 {
		t.Fatalf("acquired %d, want 1", acquired)
	}
}

func TestStore_Unavailable(t *testing.T) {
	t.Parallel()

	t.Run("MigrateInRemovedDirectory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "gone")
		db, err := sqlite.Open(filepath.Join(dir, "x.db"))
		if err != nil {
			t.Fatalf("Open (no I/O) = %v", err)
		}
		defer db.Close()
		if err := sqlite.Migrate(t.Context(), db); !errors.Is(err, durable.ErrUnavailable) {
			t.Fatalf("err %v, want ErrUnavailable", err)
		}
	})

	t.Run("EveryMethodOnClosedDB", func(t *testing.T) {
		s := open(t)
		r := mustClaim(t, s, params(newScope(), "v1:a"))
		s.Close()
		ctx := t.Context()
		_, claimErr := s.Claim(ctx, nil, params(newScope(), "v1:a"))
		_, getErr := s.Get(ctx, r.Ref)
		_, adoptErr := s.Adopt(ctx, r.Ref, uuid.New(), 0, time.Second)
		_, pendErr := s.Pending(ctx, 0, 1)
		_, sweepErr := s.Sweep(ctx, 1)
		_, statsErr := s.Stats(ctx)
		for name, err := range map[string]error{
			"claim":     claimErr,
			"complete":  s.Complete(ctx, nil, r.Ref, r.Token, okResult),
			"fail":      s.Fail(ctx, nil, r.Ref, r.Token, okResult),
			"uncertain": s.MarkUncertain(ctx, r.Ref, r.Token),
			"renew":     s.Renew(ctx, r.Ref, r.Token, time.Second),
			"release":   s.Release(ctx, nil, r.Ref, r.Token),
			"adopt":     adoptErr,
			"pending":   pendErr,
			"get":       getErr,
			"sweep":     sweepErr,
			"stats":     statsErr,
			"intx":      s.InTx(ctx, func(context.Context, *sql.Tx) error { return nil }),
			"migrate":   s.Migrate(ctx),
		} {
			if !errors.Is(err, durable.ErrUnavailable) {
				t.Errorf("%s: %v, want ErrUnavailable", name, err)
			}
		}
	})

	t.Run("CancelledContext", func(t *testing.T) {
		s := open(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := s.Claim(ctx, nil, params(newScope(), "v1:a"))
		if !errors.Is(err, durable.ErrUnavailable) || !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want ErrUnavailable and context.Canceled", err)
		}
	})
}

func TestOpen_Options(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		path string
		opts []sqlite.Option
	}{
		"EmptyPath":      {path: ""},
		"Memory":         {path: ":memory:"},
		"URI":            {path: "file:x.db"},
		"QueryInPath":    {path: filepath.Join(dir, "x.db?mode=ro")},
		"BadTable":       {path: filepath.Join(dir, "x.db"), opts: []sqlite.Option{sqlite.WithTable("x; DROP TABLE y")}},
		"ReservedTable":  {path: filepath.Join(dir, "x.db"), opts: []sqlite.Option{sqlite.WithTable("sqlite_master")}},
		"TinyBusyTimout": {path: filepath.Join(dir, "x.db"), opts: []sqlite.Option{sqlite.WithBusyTimeout(time.Microsecond)}},
		"BusyTimeout30s": {path: filepath.Join(dir, "x.db"), opts: []sqlite.Option{sqlite.WithBusyTimeout(30 * time.Second)}},
		"BusyTimeout1h":  {path: filepath.Join(dir, "x.db"), opts: []sqlite.Option{sqlite.WithBusyTimeout(time.Hour)}},
		"EmptySecret":    {path: filepath.Join(dir, "x.db"), opts: []sqlite.Option{sqlite.WithKeySecret(nil)}},
	} {
		t.Run(name, func(t *testing.T) {
			db, err := sqlite.Open(tc.path, tc.opts...)
			if !errors.Is(err, sqlite.ErrConfig) {
				t.Fatalf("Open: err %v, want ErrConfig", err)
			}
			if db != nil {
				t.Fatal("Open returned a database with its error")
			}
			if len(tc.opts) == 0 {
				return
			}
			good, err := sqlite.Open(filepath.Join(dir, "x.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer good.Close()
			if _, err := sqlite.New(good, tc.opts...); !errors.Is(err, sqlite.ErrConfig) {
				t.Fatalf("New: err %v, want ErrConfig", err)
			}
			if err := sqlite.Migrate(t.Context(), good, tc.opts...); !errors.Is(err, sqlite.ErrConfig) {
				t.Fatalf("Migrate: err %v, want ErrConfig", err)
			}
		})
	}
	if _, err := sqlite.New(nil); !errors.Is(err, sqlite.ErrConfig) {
		t.Fatalf("New(nil): %v", err)
	}
	if err := sqlite.Migrate(t.Context(), nil); !errors.Is(err, sqlite.ErrConfig) {
		t.Fatalf("Migrate(nil): %v", err)
	}
	db, err := sqlite.Open(filepath.Join(dir, "y.db"), sqlite.WithBusyTimeout(30*time.Second-time.Millisecond))
	if err != nil {
		t.Fatalf("a busy timeout just under 30s: %v", err)
	}
	db.Close()
}

func TestStore_TableAndSecret(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "two.db")
	a := openAt(t, path)
	b := openAt(t, path, sqlite.WithTable("other_requests"), sqlite.WithKeySecret([]byte("s3cret")))
	if b.Table() != "other_requests" {
		t.Fatal(b.Table())
	}
	sc := newScope()
	ra, _ := a.Ref(sc)
	rb, _ := b.Ref(sc)
	if ra.KeyHash == rb.KeyHash {
		t.Fatal("the secret did not change the key hash")
	}
	if r := mustClaim(t, a, params(sc, "v1:a")); !r.Acquired {
		t.Fatal("a did not acquire")
	}
	if r := mustClaim(t, b, params(sc, "v1:a")); !r.Acquired {
		t.Fatal("b did not acquire: the tables are not separate")
	}
	var n int
	if err := a.DB().QueryRowContext(t.Context(), `SELECT count(*) FROM other_requests`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("other_requests has %d rows, %v", n, err)
	}
}

func TestStore_Migrate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "m.db")
	s, err := sqlite.OpenStore(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := s.Migrate(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
	other := openAt(t, path) // another connection pool migrating the same file
	wg.Wait()
	mustClaim(t, other, params(newScope(), "v1:a"))
	mustClaim(t, s, params(newScope(), "v1:a"))
}

// TestStore_NoRawKeyOnDisk checks that neither the raw key nor the body of
// a request's key reaches the database file or its WAL.
func TestStore_NoRawKeyOnDisk(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openAt(t, filepath.Join(dir, "k.db"))
	sc := durable.Scope{Tenant: "t", Operation: "op", Key: "RAW-KEY-7f3a9c1e-visible-if-leaked"}
	r := mustClaim(t, s, params(sc, "v1:a"))
	if err := s.Complete(t.Context(), nil, r.Ref, r.Token, okResult); err != nil {
		t.Fatal(err)
	}
	s.Close() // checkpoints the WAL into the file
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), sc.Key) {
			t.Fatalf("raw key found in %s", e.Name())
		}
	}
}

// Migration 002 converts the rows of a database migrated by an earlier
// release (001 applied, no version recorded): retention_us from expires_at -
// created_at, and the JSON headers to the byte-for-byte encoding, exactly as
// the store's Go code encodes them. Rows the previous version writes
// afterwards (neither column) are still read and finished correctly, and
// Migrate runs each version once.
func TestMigrate_002ConvertsExistingRows(t *testing.T) {
	t.Parallel()
	s, err := sqlite.OpenStore(t.Context(), filepath.Join(t.TempDir(), "legacy.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	up1, err := fs.ReadFile(sqlite.Migrations(), "001_create_idempotency_requests.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().ExecContext(ctx, string(up1)); err != nil {
		t.Fatalf("001 up: %v", err)
	}
	legacy := map[string][]string{
		"Content-Type": {"application/json"},
		"Set-Cookie":   {"a=1", "b=2", ""},
		"X-Empty":      {},
		"\u00c9tag":    {"\u00e9t\u00e9", "10:"},
		"A":            {"first by bytes"},
	}
	legacyJSON, _ := json.Marshal(legacy)
	insert := func(state string, hdrs []byte, retention time.Duration) (durable.Ref, fence.Token) {
		t.Helper()
		ref, _ := s.Ref(newScope())
		tok := fence.Token{Generation: 7, Owner: uuid.New()}
		var h any
		if hdrs != nil {
			h = string(hdrs)
		}
		_, err := s.DB().ExecContext(ctx, `INSERT INTO idempotency_requests (tenant_id, operation, key_hash, request_hash,
			state, generation, owner_token, lease_expires_at, status_code, response_headers, response_body, created_at, expires_at)
			VALUES (?1, ?2, ?3, 'v1:a', ?4, 7, ?5, CAST(unixepoch('subsec') * 1000000 AS INTEGER) + 3600000000,
				CASE WHEN ?4 = 'completed' THEN 201 END, ?6, CASE WHEN ?4 = 'completed' THEN x'00' END,
				CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 600000000,
				CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 600000000 + ?7)`,
			ref.Tenant, ref.Operation, ref.KeyHash[:], state, tok.Owner.String(), h, retention.Microseconds())
		if err != nil {
			t.Fatalf("insert a legacy row: %v", err)
		}
		return ref, tok
	}
	doneRef, _ := insert("completed", legacyJSON, time.Hour)
	openRef, openTok := insert("processing", nil, 2*time.Hour)

	check := func(what string) {
		t.Helper()
		rec := mustGet(t, s, doneRef)
		if rec.Result == nil || !maps.EqualFunc(rec.Result.Headers, legacy, slices.Equal[[]string]) {
			t.Fatalf("%s: converted headers %q; want %q", what, rec.Result.Headers, legacy)
		}
		var bin []byte
		var retUs int64
		if err := s.DB().QueryRowContext(ctx, `SELECT response_headers_bin, retention_us FROM idempotency_requests
			WHERE key_hash = ?1`, doneRef.KeyHash[:]).Scan(&bin, &retUs); err != nil {
			t.Fatal(err)
		}
		if want := headers.Encode(legacy); !bytes.Equal(bin, want) {
			t.Fatalf("%s: SQL conversion %q; the Go encoding is %q", what, bin, want)
		}
		if retUs != time.Hour.Microseconds() {
			t.Fatalf("%s: retention_us %d; want an hour", what, retUs)
		}
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over an unrecorded 001: %v", err)
	}
	check("after Migrate")
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	check("after Migrate again")
	var versions string
	if err := s.DB().QueryRowContext(ctx, `SELECT group_concat(version, ',' ORDER BY version) FROM oncekey_migration
		WHERE table_name = 'idempotency_requests'`).Scan(&versions); err != nil || versions != "1,2,3,4" {
		t.Fatalf("recorded versions %q, %v; want 1,2,3,4", versions, err)
	}

	// The converted retention governs a late finish: two hours from now.
	if err := s.Complete(ctx, nil, openRef, openTok, okResult); err != nil {
		t.Fatal(err)
	}
	if rec := mustGet(t, s, openRef); rec.ExpiresIn < 2*time.Hour-time.Minute || rec.ExpiresIn > 2*time.Hour {
		t.Fatalf("legacy record finished now: ExpiresIn %v; want its two-hour retention from now", rec.ExpiresIn)
	}
	// Rows the previous version writes after the migration.
	lateRef, lateTok := insert("processing", nil, 3*time.Hour)
	if err := s.Complete(ctx, nil, lateRef, lateTok, okResult); err != nil {
		t.Fatal(err)
	}
	if rec := mustGet(t, s, lateRef); rec.ExpiresIn < 3*time.Hour-time.Minute || rec.ExpiresIn > 3*time.Hour {
		t.Fatalf("row without retention_us finished now: ExpiresIn %v; want expires_at - created_at (3h) from now", rec.ExpiresIn)
	}
	jsonRef, _ := insert("completed", legacyJSON, time.Hour)
	if rec := mustGet(t, s, jsonRef); !maps.EqualFunc(rec.Result.Headers, legacy, slices.Equal[[]string]) {
		t.Fatalf("row without response_headers_bin: %q; want its JSON headers", rec.Result.Headers)
	}
}

// A fenced write whose caller's context is already cancelled (the caller
// went away) is still resolved by re-reading the record on a context
// detached from the caller's, as the PostgreSQL store does: a write in
// effect under the token reports success, not ErrUnavailable.
func TestStore_FencedWriteIsResolvedAfterTheCallerCancelled(t *testing.T) {
	t.Parallel()
	s := open(t)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()

	r := mustClaim(t, s, params(newScope(), "v1:a"))
	if err := s.Complete(t.Context(), nil, r.Ref, r.Token, okResult); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(cancelled, nil, r.Ref, r.Token, okResult); err != nil {
		t.Fatalf("Complete in effect, caller cancelled = %v; want success by re-reading", err)
	}

	r = mustClaim(t, s, params(newScope(), "v1:a"))
	if err := s.Release(t.Context(), nil, r.Ref, r.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(cancelled, nil, r.Ref, r.Token); err != nil {
		t.Fatalf("Release in effect, caller cancelled = %v; want success by re-reading", err)
	}

	// Not in effect: the write did not run, so the truth is "unavailable,
	// retry", never a success nor ErrFenced.
	r = mustClaim(t, s, params(newScope(), "v1:a"))
	err := s.Complete(cancelled, nil, r.Ref, r.Token, okResult)
	if !errors.Is(err, durable.ErrUnavailable) || errors.Is(err, durable.ErrFenced) {
		t.Fatalf("Complete not in effect, caller cancelled = %v; want ErrUnavailable", err)
	}
	if rec := mustGet(t, s, r.Ref); rec.State != durable.Processing {
		t.Fatalf("record %+v; want still processing", rec)
	}
}
