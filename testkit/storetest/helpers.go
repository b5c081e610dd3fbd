package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// Durations of the suite. Short ones pass within a test; long ones never do.
const (
	short = 40 * time.Millisecond
	long  = 10 * time.Minute

	fp1 = "v1:3f1c0c5e2b7d4e0a9c1f6b8d2e4a7c9b0d1e2f3a4b5c6d7e8f90a1b2c3d4e5f6"
	fp2 = "v1:8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b"

	// pollEvery and pollFor bound every wait for the database's clock.
	pollEvery = 3 * time.Millisecond
	pollFor   = 15 * time.Second

	// floorLagMs and sweepMarginMs are the contract's generation clock
	// margins: a created or restarted record's generation is at least the
	// database's clock in milliseconds minus floorLagMs, and Sweep deletes a
	// record only once its generation is below the clock minus
	// sweepMarginMs.
	floorLagMs    = 60_000
	sweepMarginMs = 120_000
	// sweepWait bounds the wait for the clock to pass a new record's
	// generation by the sweep margin (about a minute).
	sweepWait = 3 * time.Minute
)

// generationFloor is the least generation of a record created (or
// restarted) at rec.CreatedAt, by the database's clock.
func generationFloor(rec durable.Record) uint64 {
	return uint64(rec.CreatedAt.UnixMilli() - floorLagMs)
}

// dbClock returns the database's clock when rec was read: ExpiresIn is
// ExpiresAt minus that clock.
func dbClock(rec durable.Record) time.Time { return rec.ExpiresAt.Add(-rec.ExpiresIn) }

// sweepable reports whether the generation of rec is below the sweep margin
// by the database's clock when rec was read.
func sweepable(rec durable.Record) bool {
	return int64(rec.Token.Generation) < dbClock(rec).UnixMilli()-sweepMarginMs
}

// waitSweepable polls until the database's clock passed the generation of
// the record of ref by the sweep margin (about a minute after it was
// created).
func waitSweepable[TTx any](t testing.TB, s storeapi.Store[TTx], ref durable.Ref) durable.Record {
	t.Helper()
	deadline := time.Now().Add(sweepWait)
	for {
		rec := mustGet(t, s, ref)
		if sweepable(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for the clock to pass generation %d by the sweep margin (clock %v)", rec.Token.Generation, dbClock(rec))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func newScope() durable.Scope {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return durable.Scope{Tenant: "tenant-a", Operation: "POST /orders", Key: "key-" + hex.EncodeToString(b[:])}
}

func params(sc durable.Scope, fp string, lease, retention time.Duration) storeapi.ClaimParams {
	return storeapi.ClaimParams{Scope: sc, Fingerprint: fp, Owner: uuid.New(), Lease: lease, Retention: retention}
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func sampleResult() durable.Result {
	return durable.Result{
		StatusCode: 201,
		Headers: map[string][]string{
			"Content-Type": {"application/json"},
			"Location":     {"/orders/ord_1"},
			"Set-Cookie":   {"a=1", "b=2"},
			// obs-text (0x80-0xFF) is legal in a field value; it must be
			// stored byte for byte (encoding/json would turn it into U+FFFD).
			"Etag": {"W/\"\x80\xa0\xff\xfe\""},
		},
		Body:       []byte("{\"id\":\"ord_1\",\"bin\":\"\x00\xff\"}"),
		Version:    3,
		ResourceID: "ord_1",
	}
}

func rejection() durable.Result {
	return durable.Result{StatusCode: 402, Body: []byte(`{"error":"card declined"}`), Version: 1}
}

// equalResult reports whether got is exactly want, treating a nil and an
// empty header map (or value list) alike. Body must be non-nil.
func equalResult(got *durable.Result, want durable.Result) bool {
	if got == nil || got.Body == nil {
		return false
	}
	return got.StatusCode == want.StatusCode && got.Version == want.Version &&
		got.ResourceID == want.ResourceID && bytes.Equal(got.Body, want.Body) &&
		maps.EqualFunc(got.Headers, want.Headers, slices.Equal[[]string])
}

// claimInTx claims sc for fp1 in tx and returns its token; an error unless
// it acquired.
func claimInTx[TTx any](ctx context.Context, s storeapi.Store[TTx], tx TTx, sc durable.Scope) (fence.Token, error) {
	res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
	if err != nil {
		return fence.Token{}, err
	}
	if !res.Acquired {
		return fence.Token{}, fmt.Errorf("claim in tx did not acquire: %+v", res.Record)
	}
	return res.Token, nil
}

func mustRef[TTx any](t testing.TB, s storeapi.Store[TTx], sc durable.Scope) durable.Ref {
	t.Helper()
	ref, err := s.Ref(sc)
	if err != nil {
		t.Fatalf("Ref: %v", err)
	}
	return ref
}

func mustAcquire[TTx any](t testing.TB, s storeapi.Store[TTx], p storeapi.ClaimParams) fence.Token {
	t.Helper()
	res, err := s.Claim(ctxFor(t), noTx[TTx](), p)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if !res.Acquired {
		t.Fatalf("Claim did not acquire: existing record %+v", res.Record)
	}
	if res.Token.Owner != p.Owner || res.Token.Generation < 1 {
		t.Fatalf("Claim token %v: want owner %v and generation >= 1", res.Token, p.Owner)
	}
	return res.Token
}

func mustNotAcquire[TTx any](t testing.TB, s storeapi.Store[TTx], p storeapi.ClaimParams) durable.Record {
	t.Helper()
	res, err := s.Claim(ctxFor(t), noTx[TTx](), p)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Acquired || res.Record == nil {
		t.Fatalf("Claim acquired %v; want the existing record", res.Token)
	}
	return *res.Record
}

func mustGet[TTx any](t testing.TB, s storeapi.Store[TTx], ref durable.Ref) durable.Record {
	t.Helper()
	rec, err := s.Get(ctxFor(t), ref)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return rec
}

func mustNotFound[TTx any](t testing.TB, s storeapi.Store[TTx], ref durable.Ref) {
	t.Helper()
	if rec, err := s.Get(ctxFor(t), ref); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("Get = %+v, %v; want ErrNotFound", rec, err)
	}
}

func must(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func wantErr(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s = %v; want %v", what, err, target)
	}
}

// waitRecord polls Get until cond holds for the record (the database's
// clock decides leases and retention, so the suite waits for it to move
// instead of measuring time itself).
func waitRecord[TTx any](t testing.TB, s storeapi.Store[TTx], ref durable.Ref, what string, cond func(durable.Record) bool) durable.Record {
	t.Helper()
	deadline := time.Now().Add(pollFor)
	for {
		rec := mustGet(t, s, ref)
		if cond(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s: record %+v", what, rec)
		}
		time.Sleep(pollEvery)
	}
}

func waitLeaseExpired[TTx any](t testing.TB, s storeapi.Store[TTx], ref durable.Ref) durable.Record {
	t.Helper()
	return waitRecord(t, s, ref, "the lease to expire", func(r durable.Record) bool { return r.LeaseRemaining <= 0 })
}

func waitRetentionPassed[TTx any](t testing.TB, s storeapi.Store[TTx], ref durable.Ref) durable.Record {
	t.Helper()
	return waitRecord(t, s, ref, "the retention to pass", func(rec durable.Record) bool { return rec.ExpiresIn <= 0 })
}

func checkToken(t testing.TB, what string, got, want fence.Token) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: token %v; want %v", what, got, want)
	}
}

func checkState(t testing.TB, what string, rec durable.Record, want durable.State) {
	t.Helper()
	if rec.State != want {
		t.Fatalf("%s: state %q; want %q (record %+v)", what, rec.State, want, rec)
	}
}

// longCtx bounds a test that waits for the sweep margin.
func longCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), sweepWait+time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// noTx returns the zero TTx, which runs a write on its own (outside any
// transaction of the caller).
func noTx[TTx any]() (tx TTx) { return tx }
