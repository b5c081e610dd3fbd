package fastpath_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
)

const (
	fp      = "v1:fingerprint-a"
	otherFP = "v1:fingerprint-b"
	lease   = 30 * time.Second
)

func sampleResult() durable.Result {
	return durable.Result{
		StatusCode: 201,
		Headers: map[string][]string{
			"Content-Type": {"application/json"},
			"Set-Cookie":   {"a=1", "b=2", ""},
			"X-Empty":      {},
		},
		Body:       []byte{0, 1, 2, 0xff, 0xfe, '\r', '\n', 0},
		Version:    3,
		ResourceID: "ord_123",
	}
}

// scriptCase is one branch of one script, run on every backend.
type scriptCase struct {
	name string
	opts fastpath.Options
	run  func(t *testing.T, e env, s *fastpath.Scripts)
}

func TestScripts(t *testing.T) {
	t.Parallel()
	cases := append(append(append(append(claimCases(), renewCases()...), completeCases()...), releaseCases()...), syncGenCases()...)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					e := b.new(t)
					c.run(t, e, e.scripts(t, c.opts))
				})
			}
		})
	}
}

func mustClaim(t *testing.T, s *fastpath.Scripts, ref durable.Ref, a fastpath.ClaimArgs) fastpath.ClaimReply {
	t.Helper()
	r, err := s.Claim(context.Background(), ref, a)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return r
}

// acquire claims ref for owner and returns the proposed generation.
func acquire(t *testing.T, s *fastpath.Scripts, ref durable.Ref, owner uuid.UUID) uint64 {
	t.Helper()
	r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: owner, Lease: lease})
	if r.Status != fastpath.ClaimAcquired || r.Generation == 0 {
		t.Fatalf("Claim = %+v, want Acquired", r)
	}
	return r.Generation
}

// acquireGen claims ref for owner and wants generation want exactly.
// grant claims ref for owner and confirms the lease as the claimer does
// once the durable store granted it (syncgen.lua at the proposal).
func grant(t *testing.T, s *fastpath.Scripts, ref durable.Ref, owner uuid.UUID) uint64 {
	t.Helper()
	g := acquire(t, s, ref, owner)
	if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g, Owner: owner}); err != nil {
		t.Fatalf("SyncGen = %v", err)
	}
	return g
}

func acquireGen(t *testing.T, s *fastpath.Scripts, ref durable.Ref, owner uuid.UUID, want uint64) {
	t.Helper()
	if g := acquire(t, s, ref, owner); g != want {
		t.Fatalf("Claim proposed generation %d, want %d", g, want)
	}
}

// wantClockProposal checks that g is claim.lua's proposal taken between
// before and after (Redis clock readings): Redis's TIME in ms - 59000.
func wantClockProposal(t *testing.T, g uint64, before, after time.Time) {
	t.Helper()
	lo, hi := clockFloor(before), clockFloor(after)
	if g < lo || g > hi {
		t.Fatalf("generation %d, want Redis's clock in ms - %d at the call, in [%d, %d]", g, proposalLagMS, lo, hi)
	}
}

// waitGone waits until key has expired by itself.
func waitGone(t *testing.T, c redis.UniversalClient, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for exists(t, c, key) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still there after 5s", key)
		}
		time.Sleep(time.Millisecond)
	}
}

// complete runs Complete and wants the cached flag want.
func complete(t *testing.T, s *fastpath.Scripts, ref durable.Ref, tok fence.Token, res durable.Result, ttl time.Duration, want bool) {
	t.Helper()
	cached, err := s.Complete(context.Background(), ref, tok, fp, durable.Completed, res, ttl)
	if err != nil || cached != want {
		t.Fatalf("Complete(%+v, ttl %v) = %v, %v; want cached %v", tok, ttl, cached, err, want)
	}
}

func claimCases() []scriptCase {
	return []scriptCase{
		{name: "ClaimFreshKeyProposesRedisClockMinus59s", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			before := redisTime(t, e.raw)
			g := acquire(t, s, ref, o)
			wantClockProposal(t, g, before, redisTime(t, e.raw))
			k := s.Keys(ref)
			wantLease(t, stored(t, e.raw, k), o, g, fp, lease)
			// The spec's bytes: exact decimal strings, never a float
			// spelling such as 1.8e+12.
			// A fresh lease is tentative: the durable store has not
			// granted it yet.
			if got, want := get(t, e.raw, k.Record), "T"+genOf(g)+":30000:"+o.String()+fp; got != want {
				t.Errorf("record = %q, want %q", got, want)
			}
		}},
		{name: "ClaimGenerationRoundTripsExactly", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// The proposal goes back through the lease, the busy reply,
			// complete.lua's cache and syncgen.lua without a digit lost.
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			if g < 1_000_000_000_000 {
				t.Fatalf("generation %d, want the clock term (ms since 1970 - 59s)", g)
			}
			if r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease}); r.Status != fastpath.ClaimBusy || r.Generation != g {
				t.Fatalf("Claim by another owner = %+v, want Busy at %d", r, g)
			}
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}); err != nil {
				t.Fatal(err)
			}
			k := s.Keys(ref)
			wantLease(t, stored(t, e.raw, k), o[0], g, fp, lease)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o[0]}, sampleResult(), time.Hour, true)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease})
			if r.Status != fastpath.ClaimCached || r.Cached.Generation != g {
				t.Fatalf("Claim = %+v, want Cached at %d", r, g)
			}
			wantResult(t, stored(t, e.raw, k), g, fp, 59*time.Minute, time.Hour)
		}},
		{name: "ClaimRerunBySameOwnerReturnsSameGenerationAndWritesNothing", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			k := s.Keys(ref)
			v := get(t, e.raw, k.Record)
			for range 2 {
				time.Sleep(3 * time.Millisecond) // the clock moves on; the re-run's proposal must not
				acquireGen(t, s, ref, o, g)
			}
			if got := get(t, e.raw, k.Record); got != v {
				t.Errorf("record = %q after three runs by one owner, want %q", got, v)
			}
			wantLease(t, stored(t, e.raw, k), o, g, fp, lease)
		}},
		{name: "ClaimTakeoverAfterLeaseRanOutProposesHigherGeneration", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// A takeover comes at least one lease after the lease it
			// replaces was proposed, so Redis's clock has moved past it.
			const short = 50 * time.Millisecond
			ref, o := refFor(t, "k"), owners(2)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[0], Lease: short})
			if r.Status != fastpath.ClaimAcquired {
				t.Fatalf("Claim = %+v, want Acquired", r)
			}
			g := r.Generation
			k := s.Keys(ref)
			waitGone(t, e.raw, k.Record) // the lease runs out by itself
			before := redisTime(t, e.raw)
			g2 := acquire(t, s, ref, o[1])
			wantClockProposal(t, g2, before, redisTime(t, e.raw))
			if g2 <= g {
				t.Fatalf("takeover proposed %d, want above the replaced lease's %d", g2, g)
			}
			// One lease length later, give or take the millisecond between
			// the script's start and its TIME.
			if g2 < g+uint64(short.Milliseconds())-1 {
				t.Errorf("takeover proposed %d, want at least one %v lease above %d", g2, short, g)
			}
			wantLease(t, stored(t, e.raw, k), o[1], g2, fp, lease)
		}},
		{name: "ClaimTreatsValueThatIsNeitherLeaseNorResultAsAbsent", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			for i, v := range []string{
				"not-a-record",
				"",
				"Rabc",
				"L1700000000000",
				"1:30000:" + uuid.NewString() + fp,
				"X1:30000:" + uuid.NewString() + fp,
			} {
				ref, o := refFor(t, fmt.Sprint("k", i)), uuid.New()
				k := s.Keys(ref)
				if err := e.raw.Set(context.Background(), k.Record, v, 0).Err(); err != nil {
					t.Fatal(err)
				}
				before := redisTime(t, e.raw)
				r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o, Lease: lease})
				if r.Status != fastpath.ClaimAcquired {
					t.Fatalf("Claim on %q = %+v, want Acquired", v, r)
				}
				wantClockProposal(t, r.Generation, before, redisTime(t, e.raw))
				// The value without a TTL became a lease with one.
				wantLease(t, stored(t, e.raw, k), o, r.Generation, fp, lease)
			}
		}},
		{name: "ClaimByOtherOwnerSeesBusyWithHoldersLeaseLength", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			const holderLease = 7 * time.Second
			ref, o := refFor(t, "k"), owners(2)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[0], Lease: holderLease})
			if r.Status != fastpath.ClaimAcquired {
				t.Fatalf("Claim = %+v, want Acquired", r)
			}
			g := r.Generation
			k := s.Keys(ref)
			v := get(t, e.raw, k.Record)
			r = mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease})
			if r.Status != fastpath.ClaimBusy || r.Generation != g || r.Owner != o[0] || !r.SameRequest {
				t.Fatalf("Claim = %+v, want Busy by %s at generation %d for the same request", r, o[0], g)
			}
			// The holder's lease length (an upper bound of its remaining
			// time), not the asking claim's.
			if r.Lease != holderLease {
				t.Errorf("busy Lease = %v, want the holder's %v", r.Lease, holderLease)
			}
			if got := get(t, e.raw, k.Record); got != v {
				t.Errorf("record = %q after a busy claim, want %q", got, v)
			}
		}},
		{name: "ClaimWithOtherFingerprintOnLiveLeaseIsBusyNotMismatch", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			for _, owner := range o { // the holder itself with another fingerprint, too
				r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: otherFP, Owner: owner, Lease: lease})
				if r.Status != fastpath.ClaimBusy || r.Owner != o[0] || r.SameRequest || r.Generation != g || r.Lease != lease {
					t.Fatalf("Claim by %s = %+v, want Busy for another request", owner, r)
				}
			}
			wantLease(t, stored(t, e.raw, s.Keys(ref)), o[0], g, fp, lease)
		}},
		{name: "ClaimReplaysCachedResultExactly", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			want := sampleResult()
			complete(t, s, ref, fence.Token{Generation: g, Owner: o[0]}, want, time.Hour, true)
			k := s.Keys(ref)
			v := get(t, e.raw, k.Record)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease})
			if r.Status != fastpath.ClaimCached || r.Cached == nil {
				t.Fatalf("Claim = %+v, want Cached", r)
			}
			c := r.Cached
			if c.Fingerprint != fp || c.State != durable.Completed || c.Generation != g || c.TTL != 0 {
				t.Errorf("cached = %q %q %d TTL %v", c.Fingerprint, c.State, c.Generation, c.TTL)
			}
			if !reflect.DeepEqual(c.Result, want) {
				t.Errorf("cached result = %#v\nwant %#v", c.Result, want)
			}
			if got := get(t, e.raw, k.Record); got != v {
				t.Errorf("record = %q after a replay, want it unchanged", got)
			}
			wantResult(t, stored(t, e.raw, k), g, fp, 59*time.Minute, time.Hour)
		}},
		{name: "ClaimWithTTLCarriesCachedCopysTTL", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), 10*time.Minute, true)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease, WithTTL: true})
			if r.Status != fastpath.ClaimCached || r.Cached.Generation != g || r.Cached.TTL <= 9*time.Minute || r.Cached.TTL > 10*time.Minute {
				t.Fatalf("Claim WithTTL = %+v, want Cached with a TTL of about 10m", r)
			}
		}},
		{name: "ClaimReplaysCachedFailure", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			want := durable.Result{StatusCode: 402, Body: []byte{}}
			if _, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o}, fp, durable.Failed, want, time.Hour); err != nil {
				t.Fatal(err)
			}
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
			if r.Status != fastpath.ClaimCached || r.Cached.State != durable.Failed || !reflect.DeepEqual(r.Cached.Result, want) {
				t.Fatalf("Claim = %+v", r)
			}
		}},
		{name: "ClaimWithOtherFingerprintOnCachedResultIsMismatch", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), time.Hour, true)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: otherFP, Owner: uuid.New(), Lease: lease})
			if r.Status != fastpath.ClaimMismatch || r.Cached != nil {
				t.Fatalf("Claim = %+v, want Mismatch", r)
			}
			// No lease taken: the result is still there.
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g, fp, 59*time.Minute, time.Hour)
		}},
		{name: "ClaimAfterRecordLossProposesRedisClockAgain", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// Redis lost the key (restart, eviction): the proposal is the
			// clock again; the durable store's GREATEST(proposed, old+1, its
			// clock - 60s) and SyncGen answer a proposal that fell behind.
			ref, o := refFor(t, "k"), owners(2)
			acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			if err := e.raw.Del(context.Background(), k.Record).Err(); err != nil {
				t.Fatal(err)
			}
			before := redisTime(t, e.raw)
			g := acquire(t, s, ref, o[1])
			wantClockProposal(t, g, before, redisTime(t, e.raw))
			wantLease(t, stored(t, e.raw, k), o[1], g, fp, lease)
		}},
	}
}

func renewCases() []scriptCase {
	return []scriptCase{
		{name: "RenewByHolderExtendsLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o, Lease: time.Second})
			held, err := s.Renew(context.Background(), ref, fence.Token{Generation: r.Generation, Owner: o}, 10*time.Minute)
			if err != nil || !held {
				t.Fatalf("Renew = %v, %v; want held", held, err)
			}
			st := stored(t, e.raw, s.Keys(ref))
			if st.Kind != fastpath.StoredLease || st.Owner != o.String() || st.Generation != r.Generation || st.Fingerprint != fp {
				t.Errorf("record = %+v after renew, want %s's lease at %d", st, o, r.Generation)
			}
			if st.TTL <= time.Second || st.TTL > 10*time.Minute {
				t.Errorf("lease TTL = %v after renew, want in (1s, 10m]", st.TTL)
			}
			if st.Lease != 10*time.Minute { // a busy reply's hint follows the renewal
				t.Errorf("lease length = %v after a renew of 10m, want 10m", st.Lease)
			}
			if st.Tentative { // only a holder the store granted renews
				t.Errorf("lease still tentative after a renew")
			}
		}},
		{name: "SyncGenConfirmsTentativeLeaseOnlyWhileHeld", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			if r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease}); r.Status != fastpath.ClaimBusy || !r.Tentative || !r.SameRequest {
				t.Fatalf("duplicate before the grant = %+v, want busy, tentative", r)
			}
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}); err != nil {
				t.Fatal(err)
			}
			if r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease}); r.Status != fastpath.ClaimBusy || r.Tentative {
				t.Fatalf("duplicate after the grant = %+v, want busy, confirmed", r)
			}
			// A confirmation that arrives after the completion (it is sent
			// off the caller's path) changes nothing.
			complete(t, s, ref, fence.Token{Generation: g, Owner: o[0]}, sampleResult(), time.Hour, true)
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}); err != nil {
				t.Fatal(err)
			}
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g, fp, 59*time.Minute, time.Hour)
			// Nor does one for a lease that is gone.
			ref2 := refFor(t, "k2")
			if err := s.SyncGen(context.Background(), ref2, fence.Token{Generation: g, Owner: o[0]}); err != nil {
				t.Fatal(err)
			}
			if exists(t, e.raw, s.Keys(ref2).Record) {
				t.Error("a confirmation brought a lease back")
			}
		}},
		{name: "RenewByStaleOwnerAfterTakeoverFails", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			e.expire(t, k.Record)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: time.Second})
			held, err := s.Renew(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}, 10*time.Minute)
			if err != nil || held {
				t.Fatalf("stale Renew = %v, %v; want not held", held, err)
			}
			// Not extended: the new owner's lease keeps its TTL of at most 1s.
			wantLease(t, stored(t, e.raw, k), o[1], r.Generation, fp, time.Second)
		}},
		{name: "RenewAfterExpiryDoesNotBringLeaseBack", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			e.expire(t, s.Keys(ref).Record)
			held, err := s.Renew(context.Background(), ref, fence.Token{Generation: g, Owner: o}, lease)
			if err != nil || held {
				t.Fatalf("Renew = %v, %v; want not held", held, err)
			}
			if exists(t, e.raw, s.Keys(ref).Record) {
				t.Error("renew recreated an expired lease")
			}
		}},
		{name: "RenewIgnoresLeaseGenerationNotYetSynced", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// Redis proposed g, the database said g+6, SyncGen did not run:
			// the owner still holds the Redis lease.
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			held, err := s.Renew(context.Background(), ref, fence.Token{Generation: g + 6, Owner: o}, lease)
			if err != nil || !held {
				t.Fatalf("Renew = %v, %v; want held", held, err)
			}
		}},
		{name: "RenewLeavesResultAlone", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), 10*time.Minute, true)
			held, err := s.Renew(context.Background(), ref, fence.Token{Generation: g, Owner: o}, time.Hour)
			if err != nil || held {
				t.Fatalf("Renew on a result = %v, %v; want not held", held, err)
			}
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g, fp, 9*time.Minute, 10*time.Minute)
		}},
	}
}

func completeCases() []scriptCase {
	return []scriptCase{
		{name: "CompleteByHolderCachesAndDropsLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), 10*time.Minute, true)
			// The one key holds the result now: the lease is gone.
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g, fp, 9*time.Minute, 10*time.Minute)
		}},
		{name: "CompleteCachesForAtMostCacheTTL", opts: fastpath.Options{CacheTTL: time.Hour}, run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), 48*time.Hour, true)
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g, fp, 59*time.Minute, time.Hour)
		}},
		{name: "CompleteByStaleOwnerAfterTakeoverKeepsNewLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			e.expire(t, k.Record)
			g2 := grant(t, s, ref, o[1])
			if g2 <= g {
				t.Fatalf("takeover proposed %d, want above %d", g2, g)
			}
			complete(t, s, ref, fence.Token{Generation: g, Owner: o[0]}, sampleResult(), time.Hour, false)
			wantLease(t, stored(t, e.raw, k), o[1], g2, fp, lease)
		}},
		{name: "CompleteReplacesOtherOwnersLeaseOfLowerOrEqualGeneration", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// The store committed this result: a lease of another owner
			// whose generation is not above it is stale, and the result
			// takes the key.
			for _, c := range []struct {
				name   string
				delta  int64
				cached bool
			}{{"lower", -1, false}, {"equal", 0, true}, {"higher", 1, true}} {
				t.Run(c.name, func(t *testing.T) {
					ref, o := refFor(t, "k"), owners(2)
					g := grant(t, s, ref, o[0])
					k := s.Keys(ref)
					v := get(t, e.raw, k.Record)
					tok := fence.Token{Generation: uint64(int64(g) + c.delta), Owner: o[1]}
					complete(t, s, ref, tok, sampleResult(), 10*time.Minute, c.cached)
					if !c.cached {
						// Stale: the holder's lease is untouched.
						if got := get(t, e.raw, k.Record); got != v {
							t.Errorf("record = %q after a stale completion, want %q", got, v)
						}
						wantLease(t, stored(t, e.raw, k), o[0], g, fp, lease)
						return
					}
					wantResult(t, stored(t, e.raw, k), tok.Generation, fp, 9*time.Minute, 10*time.Minute)
					r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[0], Lease: lease})
					if r.Status != fastpath.ClaimCached || r.Cached.Generation != tok.Generation {
						t.Fatalf("Claim by the replaced holder = %+v, want Cached at %d", r, tok.Generation)
					}
				})
			}
		}},
		{name: "CompleteRefillReplacesLeaseOfLowerOrEqualGeneration", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// A refill from the database (no owner) is a committed result
			// too: it replaces a lease not above it, and keeps one above.
			for _, c := range []struct {
				name   string
				delta  int64
				cached bool
			}{{"lower", -1, false}, {"equal", 0, true}} {
				t.Run(c.name, func(t *testing.T) {
					ref, o := refFor(t, "k"), uuid.New()
					g := grant(t, s, ref, o)
					k := s.Keys(ref)
					tok := fence.Token{Generation: uint64(int64(g) + c.delta)}
					complete(t, s, ref, tok, sampleResult(), time.Hour, c.cached)
					if c.cached {
						wantResult(t, stored(t, e.raw, k), tok.Generation, fp, 59*time.Minute, time.Hour)
					} else {
						wantLease(t, stored(t, e.raw, k), o, g, fp, lease)
					}
				})
			}
		}},
		{name: "CompleteWithTTL0DeletesOnlyItsOwnLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			v := get(t, e.raw, k.Record)
			// Another owner, even of a higher generation, caching nothing:
			// the holder's lease stays as it is.
			for _, gen := range []uint64{g, g + 1} {
				complete(t, s, ref, fence.Token{Generation: gen, Owner: o[1]}, sampleResult(), 0, false)
				if got := get(t, e.raw, k.Record); got != v {
					t.Fatalf("record = %q after another owner's completion with TTL 0, want %q", got, v)
				}
			}
			wantLease(t, stored(t, e.raw, k), o[0], g, fp, lease)
			// The holder's own: deleted.
			complete(t, s, ref, fence.Token{Generation: g, Owner: o[0]}, sampleResult(), 0, false)
			if exists(t, e.raw, k.Record) {
				t.Errorf("record = %q after the holder's completion with TTL 0, want none", get(t, e.raw, k.Record))
			}
		}},
		{name: "CompleteWithTTL0LeavesResultAlone", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), 10*time.Minute, true)
			complete(t, s, ref, fence.Token{Generation: g + 1, Owner: uuid.New()}, sampleResult(), 0, false)
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g, fp, 9*time.Minute, 10*time.Minute)
		}},
		{name: "CompleteAfterOwnLeaseExpiredStillCaches", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// The durable store accepted the completion; the Redis lease had
			// simply run out first.
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			e.expire(t, s.Keys(ref).Record)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), time.Hour, true)
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g, fp, 59*time.Minute, time.Hour)
		}},
		{name: "CompleteRerunChangesNothing", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			tok := fence.Token{Generation: g, Owner: o}
			complete(t, s, ref, tok, sampleResult(), time.Hour, true)
			k := s.Keys(ref)
			v := get(t, e.raw, k.Record)
			// Let time pass for the cached copy (by its effect), then re-run,
			// and refill the same result from the database.
			if err := e.raw.PExpire(context.Background(), k.Record, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			for _, tok := range []fence.Token{tok, {Generation: g}} {
				complete(t, s, ref, tok, sampleResult(), time.Hour, true)
				if got := get(t, e.raw, k.Record); got != v {
					t.Errorf("record = %q after the same result again, want %q", got, v)
				}
				// Not extended: the same result is left as it is, TTL too.
				wantResult(t, stored(t, e.raw, k), g, fp, 0, time.Minute)
			}
		}},
		{name: "CompleteWithLargeBodyLeavesMarkerAndDropsLease", opts: fastpath.Options{MaxCachedBody: 16}, run: func(t *testing.T, e env, s *fastpath.Scripts) {
			for _, c := range []struct {
				size   int
				cached bool
			}{{16, true}, {17, false}} {
				ref, o := refFor(t, "k"+genOf(uint64(c.size))), uuid.New()
				g := acquire(t, s, ref, o)
				res := durable.Result{StatusCode: 200, Body: bytes.Repeat([]byte("x"), c.size)}
				complete(t, s, ref, fence.Token{Generation: g, Owner: o}, res, time.Hour, c.cached)
				st := stored(t, e.raw, s.Keys(ref))
				if c.cached {
					wantResult(t, st, g, fp, 59*time.Minute, time.Hour)
					continue
				}
				// Too large: the lease is gone and the marker says the
				// operation finished, for as long as a result would stay.
				wantMarker(t, st, g, fp, 59*time.Minute, time.Hour)
				r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
				if r.Status != fastpath.ClaimFinished || r.Generation != g {
					t.Errorf("Claim of a finished marker = %+v, want finished at %d", r, g)
				}
				if r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: "v1:other", Owner: uuid.New(), Lease: lease}); r.Status != fastpath.ClaimMismatch {
					t.Errorf("Claim with another fingerprint = %+v, want mismatch", r)
				}
				if st := stored(t, e.raw, s.Keys(ref)); st.Kind != fastpath.StoredFinished {
					t.Errorf("after the claims: record = %+v, want the marker untouched (no lease taken)", st)
				}
			}
		}},
		{name: "CompleteReplacesTentativeLeaseOfAnyGeneration", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// A tentative lease was never granted: a result the store
			// committed replaces it whatever its generation, so a retry
			// that is only about to replay blocks no one.
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g - 1000}, sampleResult(), time.Hour, true)
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g-1000, fp, 59*time.Minute, time.Hour)
		}},
		{name: "CompleteMarkerKeepsCachedResultOfSameGeneration", opts: fastpath.Options{MaxCachedBody: 16}, run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			small := durable.Result{StatusCode: 200, Body: []byte("x")}
			complete(t, s, ref, fence.Token{Generation: 5}, small, time.Hour, true)
			big := durable.Result{StatusCode: 200, Body: bytes.Repeat([]byte("x"), 17)}
			complete(t, s, ref, fence.Token{Generation: 5}, big, time.Hour, false)
			wantResult(t, stored(t, e.raw, s.Keys(ref)), 5, fp, 59*time.Minute, time.Hour)
			complete(t, s, ref, fence.Token{Generation: 4}, big, time.Hour, false)
			wantResult(t, stored(t, e.raw, s.Keys(ref)), 5, fp, 59*time.Minute, time.Hour)
		}},
		{name: "CompleteWithShortTTLCachesNothingButDropsLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), 0, false)
			if exists(t, e.raw, s.Keys(ref).Record) {
				t.Error("result cached or lease kept")
			}
		}},
		{name: "CompleteKeepsResultOfHigherGeneration", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			newer := durable.Result{StatusCode: 200, Body: []byte("newer")}
			complete(t, s, ref, fence.Token{Generation: 3}, newer, time.Hour, true)
			complete(t, s, ref, fence.Token{Generation: 2}, sampleResult(), time.Hour, false)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
			if r.Status != fastpath.ClaimCached || r.Cached.Generation != 3 || string(r.Cached.Result.Body) != "newer" {
				t.Fatalf("Claim = %+v, want the generation 3 result", r)
			}
			// A higher generation replaces it.
			complete(t, s, ref, fence.Token{Generation: 4}, sampleResult(), 10*time.Minute, true)
			wantResult(t, stored(t, e.raw, s.Keys(ref)), 4, fp, 9*time.Minute, 10*time.Minute)
		}},
		{name: "CompleteComparesGenerationsBeyondDoublesExactly", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// complete.lua compares decimal strings: exact above 2^53,
			// where a Lua number is not, and across a change of length.
			for i, c := range []struct{ cached, older, newer uint64 }{
				{1<<53 + 1, 1 << 53, 1<<53 + 2},
				{99999999999999999, 99999999999999998, 100000000000000000},
			} {
				ref := refFor(t, fmt.Sprint("k", i))
				complete(t, s, ref, fence.Token{Generation: c.cached}, sampleResult(), time.Hour, true)
				complete(t, s, ref, fence.Token{Generation: c.older}, durable.Result{StatusCode: 500}, time.Hour, false)
				wantResult(t, stored(t, e.raw, s.Keys(ref)), c.cached, fp, 59*time.Minute, time.Hour)
				complete(t, s, ref, fence.Token{Generation: c.newer}, sampleResult(), time.Hour, true)
				wantResult(t, stored(t, e.raw, s.Keys(ref)), c.newer, fp, 59*time.Minute, time.Hour)
			}
		}},
		{name: "CompleteWithCachingOffLeavesMarker", opts: fastpath.Options{MaxCachedBody: -1}, run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			complete(t, s, ref, fence.Token{Generation: 1}, sampleResult(), time.Hour, false)
			wantMarker(t, stored(t, e.raw, s.Keys(ref)), 1, fp, 59*time.Minute, time.Hour)
		}},
		{name: "CompleteWithoutOwnerOrTTLMakesNoCall", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			complete(t, s, ref, fence.Token{Generation: 1}, sampleResult(), 0, false)
			if exists(t, e.raw, s.Keys(ref).Record) {
				t.Error("cached with no TTL")
			}
		}},
	}
}

func releaseCases() []scriptCase {
	return []scriptCase{
		{name: "ReleaseByHolderDropsLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			held, err := s.Release(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]})
			if err != nil || !held {
				t.Fatalf("Release = %v, %v", held, err)
			}
			k := s.Keys(ref)
			if exists(t, e.raw, k.Record) {
				t.Error("lease kept after release")
			}
			// A new claim proposes the clock again: the same generation
			// within the same millisecond (the store then picks g+1 and a
			// SyncGen follows), never a lower one.
			if g2 := acquire(t, s, ref, o[1]); g2 < g {
				t.Fatalf("Claim after release proposed %d, want at least %d", g2, g)
			}
		}},
		{name: "ReleaseByStaleOwnerKeepsNewLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			e.expire(t, k.Record)
			g2 := acquire(t, s, ref, o[1])
			held, err := s.Release(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]})
			if err != nil || held {
				t.Fatalf("stale Release = %v, %v", held, err)
			}
			wantLease(t, stored(t, e.raw, k), o[1], g2, fp, lease)
		}},
		{name: "ReleaseRerunIsNoOp", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			tok := fence.Token{Generation: g, Owner: o[0]}
			if held, err := s.Release(context.Background(), ref, tok); err != nil || !held {
				t.Fatalf("Release = %v, %v", held, err)
			}
			g2 := acquire(t, s, ref, o[1])
			if held, err := s.Release(context.Background(), ref, tok); err != nil || held {
				t.Fatalf("re-run Release = %v, %v; want no-op", held, err)
			}
			wantLease(t, stored(t, e.raw, s.Keys(ref)), o[1], g2, fp, lease)
		}},
		{name: "ReleaseLeavesResultAlone", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			tok := fence.Token{Generation: g, Owner: o}
			complete(t, s, ref, tok, sampleResult(), time.Hour, true)
			if held, err := s.Release(context.Background(), ref, tok); err != nil || held {
				t.Fatalf("Release after complete = %v, %v; want not held", held, err)
			}
			wantResult(t, stored(t, e.raw, s.Keys(ref)), g, fp, 59*time.Minute, time.Hour)
		}},
	}
}

func syncGenCases() []scriptCase {
	return []scriptCase{
		{name: "SyncGenRewritesHoldersLeaseGenerationAndKeepsTTL", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			// A TTL the lease length does not give: SyncGen must keep it.
			if err := e.raw.PExpire(context.Background(), k.Record, 7*time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			// The database answered far above Redis's proposal.
			db := g + 1_000_000_000
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: db, Owner: o[0]}); err != nil {
				t.Fatal(err)
			}
			// Only the generation changed: owner, lease length, fingerprint
			// and TTL are kept.
			if got, want := get(t, e.raw, k.Record), leaseValue(db, lease, o[0], fp); got != want {
				t.Errorf("record = %q after SyncGen, want %q", got, want)
			}
			if d := pttl(t, e.raw, k.Record); d <= 6*time.Minute || d > 7*time.Minute {
				t.Errorf("lease TTL = %v after SyncGen, want the 7m it had", d)
			}
			// A re-run by the holder and a busy claim now report it.
			acquireGen(t, s, ref, o[0], db)
			if r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease}); r.Status != fastpath.ClaimBusy || r.Generation != db {
				t.Fatalf("Claim by another owner = %+v, want Busy at %d", r, db)
			}
		}},
		{name: "SyncGenLeavesOtherOwnersLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			v := get(t, e.raw, k.Record)
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g + 5, Owner: o[1]}); err != nil {
				t.Fatal(err)
			}
			if got := get(t, e.raw, k.Record); got != v {
				t.Errorf("record = %q after another owner's SyncGen, want %q", got, v)
			}
			wantLease(t, stored(t, e.raw, k), o[0], g, fp, lease)
		}},
		{name: "SyncGenLeavesResultAndAbsentKeyAlone", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			k := s.Keys(ref)
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: 5, Owner: o}); err != nil {
				t.Fatal(err)
			}
			if exists(t, e.raw, k.Record) {
				t.Errorf("SyncGen on an absent key wrote %q", get(t, e.raw, k.Record))
			}
			g := acquire(t, s, ref, o)
			complete(t, s, ref, fence.Token{Generation: g, Owner: o}, sampleResult(), time.Hour, true)
			v := get(t, e.raw, k.Record)
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g + 5, Owner: o}); err != nil {
				t.Fatal(err)
			}
			if got := get(t, e.raw, k.Record); got != v {
				t.Errorf("record = %q after SyncGen on a result, want %q", got, v)
			}
		}},
		{name: "SyncGenWithoutOwnerMakesNoCall", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			cs := &countingScripter{Scripter: e.raw}
			s2, err := fastpath.New(cs, fastpath.Options{Prefix: e.prefix, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s2, ref, o)
			k := s2.Keys(ref)
			v := get(t, e.raw, k.Record)
			before := cs.n.Load()
			if err := s2.SyncGen(context.Background(), ref, fence.Token{Generation: g + 5}); err != nil {
				t.Fatal(err)
			}
			if n := cs.n.Load() - before; n != 0 {
				t.Errorf("SyncGen without owner sent %d script calls, want 0", n)
			}
			if got := get(t, e.raw, k.Record); got != v {
				t.Errorf("record = %q, want %q", got, v)
			}
		}},
		{name: "SyncGenKeepsGenerationsAbove2To53Exact", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			acquire(t, s, ref, o[0])
			const big = 1<<62 + 1
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: big, Owner: o[0]}); err != nil {
				t.Fatal(err)
			}
			k := s.Keys(ref)
			if got, want := get(t, e.raw, k.Record), leaseValue(big, lease, o[0], fp); got != want || !strings.HasPrefix(got, "L4611686018427387905:") {
				t.Errorf("record = %q, want %q", got, want)
			}
			acquireGen(t, s, ref, o[0], big)
			if r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease}); r.Status != fastpath.ClaimBusy || r.Generation != big {
				t.Fatalf("Claim by another owner = %+v, want Busy at %d", r, uint64(big))
			}
			// complete.lua's stale rule compares it exactly: big-1 is stale.
			complete(t, s, ref, fence.Token{Generation: big - 1, Owner: o[1]}, sampleResult(), time.Hour, false)
			complete(t, s, ref, fence.Token{Generation: big, Owner: o[0]}, sampleResult(), time.Hour, true)
			if r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease}); r.Status != fastpath.ClaimCached || r.Cached.Generation != big {
				t.Fatalf("Claim = %+v, want Cached at %d", r, uint64(big))
			}
		}},
	}
}

func TestScripts_Errors(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			t.Run("CorruptCachedResultIsErrCorruptAndKeepsBreakerClosed", func(t *testing.T) {
				t.Parallel()
				e := b.new(t)
				s := e.scripts(t, fastpath.Options{Breaker: fastpath.BreakerOptions{Failures: 1}})
				ref := refFor(t, "k")
				v := "R1:" + strconv.Itoa(len(fp)) + ":" + fp + "\x02garbage"
				if err := e.raw.Set(context.Background(), s.Keys(ref).Record, v, time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
				for range 3 {
					_, err := s.Claim(context.Background(), ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
					if !errors.Is(err, fastpath.ErrCorrupt) || !errors.Is(err, fastpath.ErrUnavailable) {
						t.Fatalf("Claim on a corrupt result: %v, want ErrCorrupt", err)
					}
				}
				if st := s.Breaker(); st != fastpath.BreakerClosed {
					t.Errorf("breaker = %v, want closed: Redis answered", st)
				}
			})
			t.Run("WrongTypeIsErrUnavailable", func(t *testing.T) {
				t.Parallel()
				e := b.new(t)
				s := e.scripts(t, fastpath.Options{})
				ref := refFor(t, "k")
				if err := e.raw.HSet(context.Background(), s.Keys(ref).Record, "o", "x").Err(); err != nil {
					t.Fatal(err)
				}
				_, err := s.Claim(context.Background(), ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
				if !errors.Is(err, fastpath.ErrUnavailable) || !strings.Contains(strings.ToUpper(err.Error()), "WRONGTYPE") {
					t.Fatalf("Claim on a hash record: %v, want ErrUnavailable with WRONGTYPE", err)
				}
			})
		})
	}
}

// TestClaim_MalformedRecordCountsAsAbsent: the spec (layout v2) and
// claim.lua's header say a value that is neither a lease ("L" gen ":"
// lease_ms ":" 36-byte owner fingerprint, gen and lease_ms decimal) nor a
// result ("R" gen ":" #fp ":" fp blob) counts as absent, as
// fastpath.ParseStored decodes it. These values start like one of the two
// forms but are neither.
func TestClaim_MalformedRecordCountsAsAbsent(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	for i, v := range []string{
		"R1:x:" + fp + "blob",                        // length not a number
		"R1:99:" + fp,                                // length beyond the value
		"L1:30000:short" + fp,                        // owner not 36 bytes
		"Lx:y:" + uuid.NewString() + fp,              // generation and lease_ms not decimal
		"R:" + strconv.Itoa(len(fp)) + ":" + fp + "", // no generation
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if _, ok := fastpath.ParseStored(v); ok {
				t.Fatalf("ParseStored(%q) ok; the case is not malformed", v)
			}
			s := e.scripts(t, fastpath.Options{Breaker: fastpath.BreakerOptions{Failures: 1}})
			ref, o := refFor(t, "k"), uuid.New()
			k := s.Keys(ref)
			if err := e.raw.Set(context.Background(), k.Record, v, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			r, err := s.Claim(context.Background(), ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o, Lease: lease})
			if err != nil || r.Status != fastpath.ClaimAcquired {
				t.Errorf("Claim on %q = %+v, %v; want Acquired (the value counts as absent)", v, r, err)
			}
			if st := s.Breaker(); st != fastpath.BreakerClosed {
				t.Errorf("breaker = %v after a Claim on %q, want closed", st, v)
			}
		})
	}
}

func TestScripts_InvalidArguments(t *testing.T) {
	t.Parallel()
	// Nothing listens here: a call that reached Redis would fail with
	// ErrUnavailable, not ErrInvalidArgument; the counter proves no call.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	cs := &countingScripter{Scripter: c}
	s, err := fastpath.New(cs, fastpath.Options{Breaker: fastpath.BreakerOptions{Failures: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref := refFor(t, "k")
	o := uuid.New()
	good := fastpath.ClaimArgs{Fingerprint: fp, Owner: o, Lease: lease}
	with := func(f func(*fastpath.ClaimArgs)) fastpath.ClaimArgs { a := good; f(&a); return a }
	calls := map[string]func() error{
		"ClaimEmptyFingerprint": func() error {
			_, err := s.Claim(ctx, ref, with(func(a *fastpath.ClaimArgs) { a.Fingerprint = "" }))
			return err
		},
		"ClaimLongFingerprint": func() error {
			_, err := s.Claim(ctx, ref, with(func(a *fastpath.ClaimArgs) { a.Fingerprint = strings.Repeat("f", 257) }))
			return err
		},
		"ClaimNilOwner": func() error {
			_, err := s.Claim(ctx, ref, with(func(a *fastpath.ClaimArgs) { a.Owner = uuid.Nil }))
			return err
		},
		"ClaimShortLease": func() error {
			_, err := s.Claim(ctx, ref, with(func(a *fastpath.ClaimArgs) { a.Lease = time.Microsecond }))
			return err
		},
		"RenewNilOwner":   func() error { _, err := s.Renew(ctx, ref, fence.Token{Generation: 1}, lease); return err },
		"RenewShortLease": func() error { _, err := s.Renew(ctx, ref, fence.Token{Generation: 1, Owner: o}, 0); return err },
		"ReleaseNilOwner": func() error { _, err := s.Release(ctx, ref, fence.Token{Generation: 1}); return err },
		"CompleteGeneration0": func() error {
			_, err := s.Complete(ctx, ref, fence.Token{Owner: o}, fp, durable.Completed, durable.Result{}, time.Hour)
			return err
		},
		"CompleteEmptyFingerprint": func() error {
			_, err := s.Complete(ctx, ref, fence.Token{Generation: 1, Owner: o}, "", durable.Completed, durable.Result{}, time.Hour)
			return err
		},
		"CompleteUnfinishedState": func() error {
			_, err := s.Complete(ctx, ref, fence.Token{Generation: 1, Owner: o}, fp, durable.Uncertain, durable.Result{}, time.Hour)
			return err
		},
		"SyncGenGeneration0": func() error { return s.SyncGen(ctx, ref, fence.Token{Owner: o}) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, fastpath.ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
		})
	}
	// Without an owner SyncGen has no lease to rewrite: no call, no error
	// (the client would fail one).
	if err := s.SyncGen(ctx, ref, fence.Token{Generation: 1}); err != nil {
		t.Errorf("SyncGen without owner = %v, want nil with no call", err)
	}
	if n := cs.n.Load(); n != 0 {
		t.Errorf("%d script calls reached the client, want 0", n)
	}
	if st := s.Breaker(); st != fastpath.BreakerClosed {
		t.Errorf("breaker = %v after invalid calls, want closed", st)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	bad := map[string]fastpath.Options{
		"PrefixWithOpenBrace":  {Prefix: "a{b"},
		"PrefixWithCloseBrace": {Prefix: "a}"},
		"NegativeTimeout":      {Timeout: -1},
		"NegativeCacheTTL":     {CacheTTL: -1},
		"NegativeFailures":     {Breaker: fastpath.BreakerOptions{Failures: -1}},
		"NegativeCoolDown":     {Breaker: fastpath.BreakerOptions{CoolDown: -1}},
	}
	for name, opts := range bad {
		t.Run(name, func(t *testing.T) {
			if _, err := fastpath.New(c, opts); !errors.Is(err, fastpath.ErrInvalidArgument) {
				t.Fatalf("New = %v, want ErrInvalidArgument", err)
			}
		})
	}
	t.Run("NilClient", func(t *testing.T) {
		if _, err := fastpath.New(nil, fastpath.Options{}); !errors.Is(err, fastpath.ErrInvalidArgument) {
			t.Fatalf("New(nil) = %v", err)
		}
	})
	t.Run("ZeroOptionsTakeDefaults", func(t *testing.T) {
		s, err := fastpath.New(c, fastpath.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ref := refFor(t, "k")
		if got, want := s.Keys(ref), fastpath.KeysFor(fastpath.DefaultPrefix, ref); got != want {
			t.Errorf("Keys = %+v, want %+v", got, want)
		}
		if st := s.Breaker(); st != fastpath.BreakerClosed {
			t.Errorf("breaker = %v", st)
		}
	})
}
