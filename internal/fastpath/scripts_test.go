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
	fp        = "v1:fingerprint-a"
	otherFP   = "v1:fingerprint-b"
	lease     = 30 * time.Second
	retention = time.Hour
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
	r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: owner, Lease: lease, Retention: retention})
	if r.Status != fastpath.ClaimAcquired || r.Generation == 0 {
		t.Fatalf("Claim = %+v, want Acquired", r)
	}
	return r.Generation
}

// acquireGen claims ref for owner and wants generation want exactly.
func acquireGen(t *testing.T, s *fastpath.Scripts, ref durable.Ref, owner uuid.UUID, want uint64) {
	t.Helper()
	if g := acquire(t, s, ref, owner); g != want {
		t.Fatalf("Claim proposed generation %d, want %d", g, want)
	}
}

// acquireAfter claims ref for owner and wants a generation above prev.
func acquireAfter(t *testing.T, s *fastpath.Scripts, ref durable.Ref, owner uuid.UUID, prev uint64) uint64 {
	t.Helper()
	g := acquire(t, s, ref, owner)
	if g <= prev {
		t.Fatalf("Claim proposed generation %d, want above %d", g, prev)
	}
	return g
}

// wantClockProposal checks that g is claim.lua's clock term taken between
// before and after (Redis clock readings): Redis's TIME in ms - 59000.
func wantClockProposal(t *testing.T, g uint64, before, after time.Time) {
	t.Helper()
	lo, hi := clockFloor(before), clockFloor(after)
	if g < lo || g > hi {
		t.Fatalf("generation %d, want Redis's clock in ms - %d at the call, in [%d, %d]", g, proposalLagMS, lo, hi)
	}
}

func claimCases() []scriptCase {
	return []scriptCase{
		{name: "ClaimFreshKeyProposesRedisClockFloor", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			before := redisTime(t, e.raw)
			g := acquire(t, s, ref, o)
			wantClockProposal(t, g, before, redisTime(t, e.raw))
			k := s.Keys(ref)
			if got := hget(t, e.raw, k.Lease, "o"); got != o.String() {
				t.Errorf("lease owner = %q, want %s", got, o)
			}
			// Exact decimal strings everywhere, never a float spelling
			// such as 1.8e+12.
			for what, got := range map[string]string{"lease generation": hget(t, e.raw, k.Lease, "g"), "counter": get(t, e.raw, k.Gen)} {
				if !decimal.MatchString(got) || got != genOf(g) {
					t.Errorf("%s = %q, want %q", what, got, genOf(g))
				}
			}
			if got := hget(t, e.raw, k.Lease, "f"); got != fp {
				t.Errorf("lease fingerprint = %q", got)
			}
			if d := pttl(t, e.raw, k.Lease); d <= 0 || d > lease {
				t.Errorf("lease PTTL = %v, want in (0, %v]", d, lease)
			}
			if d := pttl(t, e.raw, k.Gen); d <= lease || d > retention {
				t.Errorf("counter PTTL = %v, want in (%v, %v]", d, lease, retention)
			}
			if exists(t, e.raw, k.Result) {
				t.Error("result key exists after a claim")
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
			if r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease, Retention: retention}); r.Status != fastpath.ClaimBusy || r.Generation != g {
				t.Fatalf("Claim by another owner = %+v, want Busy at %d", r, g)
			}
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}, retention); err != nil {
				t.Fatal(err)
			}
			k := s.Keys(ref)
			if got := get(t, e.raw, k.Gen); got != genOf(g) {
				t.Fatalf("counter = %q after SyncGen(%d), want unchanged", got, g)
			}
			if cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}, fp, durable.Completed, sampleResult(), time.Hour); err != nil || !cached {
				t.Fatalf("Complete = %v, %v", cached, err)
			}
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease, Retention: retention})
			if r.Status != fastpath.ClaimCached || r.Cached.Generation != g {
				t.Fatalf("Claim = %+v, want Cached at %d", r, g)
			}
		}},
		{name: "ClaimRerunBySameOwnerReturnsSameGenerationWithoutIncrement", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			for range 2 {
				time.Sleep(3 * time.Millisecond) // the clock term moves on; the re-run must not
				acquireGen(t, s, ref, o, g)
			}
			if got := get(t, e.raw, s.Keys(ref).Gen); got != genOf(g) {
				t.Errorf("counter = %q after three runs by one owner, want %d", got, g)
			}
		}},
		{name: "ClaimCounterAheadOfClockRisesByOne", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// A counter above the clock term (the database handed out
			// higher generations, and SyncGen brought them here) goes on
			// from where it is, one at a time.
			ref, o := refFor(t, "k"), owners(3)
			ahead := clockFloor(redisTime(t, e.raw)) + 1_000_000_000
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: ahead}, retention); err != nil {
				t.Fatal(err)
			}
			k := s.Keys(ref)
			acquireGen(t, s, ref, o[0], ahead+1)
			e.expire(t, k.Lease)
			acquireGen(t, s, ref, o[1], ahead+2)
			if _, err := s.Release(context.Background(), ref, fence.Token{Generation: ahead + 2, Owner: o[1]}); err != nil {
				t.Fatal(err)
			}
			acquireGen(t, s, ref, o[2], ahead+3)
			if got := get(t, e.raw, k.Gen); got != genOf(ahead+3) {
				t.Errorf("counter = %q, want %d", got, ahead+3)
			}
		}},
		{name: "ClaimCounterRisesByOneInDecimalBeyondDoubles", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// claim.lua adds one to the counter's decimal string: exact
			// above 2^53, where a Lua number is not, and across a carry.
			for i, c := range []struct{ counter, want string }{
				{"9007199254740993", "9007199254740994"}, // 2^53 + 1
				{"19999999999999999", "20000000000000000"},
				{"99999999999999999", "100000000000000000"},
			} {
				ref := refFor(t, fmt.Sprint("k", i))
				k := s.Keys(ref)
				if err := e.raw.Set(context.Background(), k.Gen, c.counter, retention).Err(); err != nil {
					t.Fatal(err)
				}
				want, err := strconv.ParseUint(c.want, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				acquireGen(t, s, ref, uuid.New(), want)
				if got := get(t, e.raw, k.Gen); got != c.want {
					t.Errorf("counter = %q after a claim on %q, want %q", got, c.counter, c.want)
				}
			}
		}},
		{name: "ClaimGivesCounterWithoutTTLTheRetention", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// A counter left without a TTL (restored, or PERSISTed by
			// hand) gets the retention, as a new one does.
			ref := refFor(t, "k")
			k := s.Keys(ref)
			ahead := clockFloor(redisTime(t, e.raw)) + 1_000_000
			if err := e.raw.Set(context.Background(), k.Gen, genOf(ahead), 0).Err(); err != nil {
				t.Fatal(err)
			}
			acquireGen(t, s, ref, uuid.New(), ahead+1)
			if d := pttl(t, e.raw, k.Gen); d <= lease || d > retention {
				t.Errorf("counter PTTL = %v, want in (%v, %v]", d, lease, retention)
			}
		}},
		{name: "ClaimTreatsCounterThatIsNoGenerationAsAbsent", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			k := s.Keys(ref)
			if err := e.raw.Set(context.Background(), k.Gen, "not-a-number", 0).Err(); err != nil {
				t.Fatal(err)
			}
			before := redisTime(t, e.raw)
			g := acquire(t, s, ref, uuid.New())
			wantClockProposal(t, g, before, redisTime(t, e.raw))
			if got := get(t, e.raw, k.Gen); got != genOf(g) {
				t.Errorf("counter = %q, want %d", got, g)
			}
			if d := pttl(t, e.raw, k.Gen); d <= lease || d > retention {
				t.Errorf("counter PTTL = %v, want in (%v, %v]", d, lease, retention)
			}
		}},
		{name: "ClaimCounterBehindClockJumpsToClockFloor", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: 4}, retention); err != nil {
				t.Fatal(err)
			}
			before := redisTime(t, e.raw)
			g := acquire(t, s, ref, uuid.New())
			wantClockProposal(t, g, before, redisTime(t, e.raw))
			if got := get(t, e.raw, s.Keys(ref).Gen); got != genOf(g) {
				t.Errorf("counter = %q, want %d", got, g)
			}
		}},
		{name: "ClaimByOtherOwnerSeesBusyWithHolder", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease, Retention: retention})
			if r.Status != fastpath.ClaimBusy || r.Generation != g || r.Owner != o[0] || !r.SameRequest {
				t.Fatalf("Claim = %+v, want Busy by %s at generation %d for the same request", r, o[0], g)
			}
			if r.PTTL <= 0 || r.PTTL > lease {
				t.Errorf("PTTL = %v, want in (0, %v]", r.PTTL, lease)
			}
			if got := get(t, e.raw, s.Keys(ref).Gen); got != genOf(g) {
				t.Errorf("counter = %q, want %d", got, g)
			}
		}},
		{name: "ClaimWithOtherFingerprintOnLiveLeaseIsBusyNotMismatch", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			acquire(t, s, ref, o[0])
			for _, owner := range o { // the holder itself with another fingerprint, too
				r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: otherFP, Owner: owner, Lease: lease, Retention: retention})
				if r.Status != fastpath.ClaimBusy || r.Owner != o[0] || r.SameRequest {
					t.Fatalf("Claim by %s = %+v, want Busy for another request", owner, r)
				}
			}
		}},
		{name: "ClaimAfterLeaseExpiryTakesHigherGeneration", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			e.expire(t, s.Keys(ref).Lease)
			acquireAfter(t, s, ref, o[1], g)
			if got := hget(t, e.raw, s.Keys(ref).Lease, "o"); got != o[1].String() {
				t.Errorf("lease owner = %q, want %s", got, o[1])
			}
		}},
		{name: "ClaimReplaysCachedResultExactly", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			want := sampleResult()
			if cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}, fp, durable.Completed, want, time.Hour); err != nil || !cached {
				t.Fatalf("Complete = %v, %v", cached, err)
			}
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: lease, Retention: retention})
			if r.Status != fastpath.ClaimCached || r.Cached == nil {
				t.Fatalf("Claim = %+v, want Cached", r)
			}
			c := r.Cached
			if c.Fingerprint != fp || c.State != durable.Completed || c.Generation != g {
				t.Errorf("cached = %q %q %d", c.Fingerprint, c.State, c.Generation)
			}
			if !reflect.DeepEqual(c.Result, want) {
				t.Errorf("cached result = %#v\nwant %#v", c.Result, want)
			}
			if got := get(t, e.raw, s.Keys(ref).Gen); got != genOf(g) {
				t.Errorf("counter = %q after a replay, want %d", got, g)
			}
		}},
		{name: "ClaimReplaysCachedFailure", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			want := durable.Result{StatusCode: 402, Body: []byte{}}
			if _, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o}, fp, durable.Failed, want, time.Hour); err != nil {
				t.Fatal(err)
			}
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease, Retention: retention})
			if r.Status != fastpath.ClaimCached || r.Cached.State != durable.Failed || !reflect.DeepEqual(r.Cached.Result, want) {
				t.Fatalf("Claim = %+v", r)
			}
		}},
		{name: "ClaimWithOtherFingerprintOnCachedResultIsMismatch", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			if _, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o}, fp, durable.Completed, sampleResult(), time.Hour); err != nil {
				t.Fatal(err)
			}
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: otherFP, Owner: uuid.New(), Lease: lease, Retention: retention})
			if r.Status != fastpath.ClaimMismatch || r.Cached != nil {
				t.Fatalf("Claim = %+v, want Mismatch", r)
			}
			if exists(t, e.raw, s.Keys(ref).Lease) {
				t.Error("a mismatch took a lease")
			}
		}},
		{name: "ClaimNeverShortensCounterRetention", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			e.expire(t, k.Lease)
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: time.Second, Retention: 2 * time.Second})
			if r.Status != fastpath.ClaimAcquired || r.Generation <= g {
				t.Fatalf("Claim = %+v, want Acquired above %d", r, g)
			}
			if d := pttl(t, e.raw, k.Gen); d <= 2*time.Second {
				t.Errorf("counter PTTL = %v after a shorter retention, want it kept near %v", d, retention)
			}
		}},
		{name: "ClaimAfterCounterLossProposesClockFloorAgain", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// Redis lost the key (restart, eviction): the proposal starts
			// again from the clock term. A lost counter that had run ahead
			// of the clock is answered by the durable store's
			// GREATEST(proposed, stored+1) and SyncGen.
			ref, o := refFor(t, "k"), owners(2)
			acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			if err := e.raw.Del(context.Background(), k.Lease, k.Gen).Err(); err != nil {
				t.Fatal(err)
			}
			before := redisTime(t, e.raw)
			g := acquire(t, s, ref, o[1])
			wantClockProposal(t, g, before, redisTime(t, e.raw))
			if d := pttl(t, e.raw, k.Gen); d <= lease || d > retention {
				t.Errorf("counter PTTL = %v, want in (%v, %v]", d, lease, retention)
			}
		}},
	}
}

func renewCases() []scriptCase {
	return []scriptCase{
		{name: "RenewByHolderExtendsLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o, Lease: time.Second, Retention: retention})
			held, err := s.Renew(context.Background(), ref, fence.Token{Generation: r.Generation, Owner: o}, 10*time.Minute)
			if err != nil || !held {
				t.Fatalf("Renew = %v, %v; want held", held, err)
			}
			if d := pttl(t, e.raw, s.Keys(ref).Lease); d <= time.Second || d > 10*time.Minute {
				t.Errorf("lease PTTL = %v after renew, want in (1s, 10m]", d)
			}
		}},
		{name: "RenewByStaleOwnerAfterTakeoverFails", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			e.expire(t, k.Lease)
			mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o[1], Lease: time.Second, Retention: retention})
			held, err := s.Renew(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}, 10*time.Minute)
			if err != nil || held {
				t.Fatalf("stale Renew = %v, %v; want not held", held, err)
			}
			if d := pttl(t, e.raw, k.Lease); d > time.Second {
				t.Errorf("new owner's lease PTTL = %v: the stale renew extended it", d)
			}
			if got := hget(t, e.raw, k.Lease, "o"); got != o[1].String() {
				t.Errorf("lease owner = %q, want %s", got, o[1])
			}
		}},
		{name: "RenewAfterExpiryDoesNotBringLeaseBack", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			e.expire(t, s.Keys(ref).Lease)
			held, err := s.Renew(context.Background(), ref, fence.Token{Generation: g, Owner: o}, lease)
			if err != nil || held {
				t.Fatalf("Renew = %v, %v; want not held", held, err)
			}
			if exists(t, e.raw, s.Keys(ref).Lease) {
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
	}
}

func completeCases() []scriptCase {
	return []scriptCase{
		{name: "CompleteByHolderCachesAndDropsLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o}, fp, durable.Completed, sampleResult(), 10*time.Minute)
			if err != nil || !cached {
				t.Fatalf("Complete = %v, %v", cached, err)
			}
			k := s.Keys(ref)
			if exists(t, e.raw, k.Lease) {
				t.Error("lease still there after the holder completed")
			}
			if d := pttl(t, e.raw, k.Result); d <= 9*time.Minute || d > 10*time.Minute {
				t.Errorf("result PTTL = %v, want about 10m", d)
			}
			if got := get(t, e.raw, k.Gen); got != genOf(g) {
				t.Errorf("counter = %q, want kept at %d", got, g)
			}
		}},
		{name: "CompleteCachesForAtMostCacheTTL", opts: fastpath.Options{CacheTTL: time.Hour}, run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			if _, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o}, fp, durable.Completed, sampleResult(), 48*time.Hour); err != nil {
				t.Fatal(err)
			}
			if d := pttl(t, e.raw, s.Keys(ref).Result); d <= 59*time.Minute || d > time.Hour {
				t.Errorf("result PTTL = %v, want about the 1h cache TTL", d)
			}
		}},
		{name: "CompleteByStaleOwnerAfterTakeoverKeepsNewLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			e.expire(t, k.Lease)
			acquireAfter(t, s, ref, o[1], g)
			cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]}, fp, durable.Completed, sampleResult(), time.Hour)
			if err != nil || cached {
				t.Fatalf("stale Complete = %v, %v; want nothing cached", cached, err)
			}
			if got := hget(t, e.raw, k.Lease, "o"); got != o[1].String() {
				t.Errorf("lease owner = %q, want the new owner %s", got, o[1])
			}
			if exists(t, e.raw, k.Result) {
				t.Error("a stale completion was cached")
			}
		}},
		{name: "CompleteAfterOwnLeaseExpiredStillCaches", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			// The durable store accepted the completion; the Redis lease had
			// simply run out first.
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			e.expire(t, s.Keys(ref).Lease)
			cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o}, fp, durable.Completed, sampleResult(), time.Hour)
			if err != nil || !cached {
				t.Fatalf("Complete = %v, %v; want cached", cached, err)
			}
		}},
		{name: "CompleteRerunChangesNothing", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			tok := fence.Token{Generation: g, Owner: o}
			if _, err := s.Complete(context.Background(), ref, tok, fp, durable.Completed, sampleResult(), time.Hour); err != nil {
				t.Fatal(err)
			}
			k := s.Keys(ref)
			// Let time pass for the cached copy (by its effect), then re-run.
			if err := e.raw.PExpire(context.Background(), k.Result, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			cached, err := s.Complete(context.Background(), ref, tok, fp, durable.Completed, sampleResult(), time.Hour)
			if err != nil || !cached {
				t.Fatalf("re-run Complete = %v, %v", cached, err)
			}
			if d := pttl(t, e.raw, k.Result); d > time.Minute {
				t.Errorf("result PTTL = %v after a re-run: the re-run extended the cached copy", d)
			}
		}},
		{name: "CompleteWithLargeBodyCachesNothingButDropsLease", opts: fastpath.Options{MaxCachedBody: 16}, run: func(t *testing.T, e env, s *fastpath.Scripts) {
			for _, c := range []struct {
				size   int
				cached bool
			}{{16, true}, {17, false}} {
				ref, o := refFor(t, "k"+genOf(uint64(c.size))), uuid.New()
				g := acquire(t, s, ref, o)
				res := durable.Result{StatusCode: 200, Body: bytes.Repeat([]byte("x"), c.size)}
				cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o}, fp, durable.Completed, res, time.Hour)
				if err != nil || cached != c.cached {
					t.Fatalf("Complete with a %d-byte body = %v, %v; want cached %v", c.size, cached, err, c.cached)
				}
				k := s.Keys(ref)
				if exists(t, e.raw, k.Result) != c.cached {
					t.Errorf("%d-byte body: result key exists = %v", c.size, !c.cached)
				}
				if exists(t, e.raw, k.Lease) {
					t.Errorf("%d-byte body: lease not dropped", c.size)
				}
			}
		}},
		{name: "CompleteWithShortTTLCachesNothingButDropsLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: g, Owner: o}, fp, durable.Completed, sampleResult(), 0)
			if err != nil || cached {
				t.Fatalf("Complete = %v, %v", cached, err)
			}
			k := s.Keys(ref)
			if exists(t, e.raw, k.Result) || exists(t, e.raw, k.Lease) {
				t.Error("result cached or lease kept")
			}
		}},
		{name: "CompleteRefillWithoutOwnerLeavesLeases", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: g}, fp, durable.Completed, sampleResult(), time.Hour)
			if err != nil || !cached {
				t.Fatalf("refill = %v, %v", cached, err)
			}
			if got := hget(t, e.raw, s.Keys(ref).Lease, "o"); got != o.String() {
				t.Errorf("lease owner = %q after a refill, want %s", got, o)
			}
		}},
		{name: "CompleteKeepsResultOfHigherGeneration", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			newer := durable.Result{StatusCode: 200, Body: []byte("newer")}
			if _, err := s.Complete(context.Background(), ref, fence.Token{Generation: 3}, fp, durable.Completed, newer, time.Hour); err != nil {
				t.Fatal(err)
			}
			cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: 2}, fp, durable.Completed, sampleResult(), time.Hour)
			if err != nil || cached {
				t.Fatalf("older Complete = %v, %v; want not cached", cached, err)
			}
			r := mustClaim(t, s, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease, Retention: retention})
			if r.Status != fastpath.ClaimCached || r.Cached.Generation != 3 || string(r.Cached.Result.Body) != "newer" {
				t.Fatalf("Claim = %+v, want the generation 3 result", r)
			}
		}},
		{name: "CompleteWithoutOwnerOrCacheMakesNoCall", opts: fastpath.Options{MaxCachedBody: -1}, run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			cached, err := s.Complete(context.Background(), ref, fence.Token{Generation: 1}, fp, durable.Completed, sampleResult(), time.Hour)
			if err != nil || cached {
				t.Fatalf("Complete = %v, %v", cached, err)
			}
			if exists(t, e.raw, s.Keys(ref).Result) {
				t.Error("cached with MaxCachedBody < 0")
			}
		}},
	}
}

func releaseCases() []scriptCase {
	return []scriptCase{
		{name: "ReleaseByHolderDropsLeaseKeepsCounter", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			held, err := s.Release(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]})
			if err != nil || !held {
				t.Fatalf("Release = %v, %v", held, err)
			}
			k := s.Keys(ref)
			if exists(t, e.raw, k.Lease) {
				t.Error("lease kept after release")
			}
			acquireAfter(t, s, ref, o[1], g)
		}},
		{name: "ReleaseByStaleOwnerKeepsNewLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			k := s.Keys(ref)
			e.expire(t, k.Lease)
			acquireAfter(t, s, ref, o[1], g)
			held, err := s.Release(context.Background(), ref, fence.Token{Generation: g, Owner: o[0]})
			if err != nil || held {
				t.Fatalf("stale Release = %v, %v", held, err)
			}
			if got := hget(t, e.raw, k.Lease, "o"); got != o[1].String() {
				t.Errorf("lease owner = %q, want %s", got, o[1])
			}
		}},
		{name: "ReleaseRerunIsNoOp", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			tok := fence.Token{Generation: g, Owner: o[0]}
			if held, err := s.Release(context.Background(), ref, tok); err != nil || !held {
				t.Fatalf("Release = %v, %v", held, err)
			}
			acquireAfter(t, s, ref, o[1], g)
			if held, err := s.Release(context.Background(), ref, tok); err != nil || held {
				t.Fatalf("re-run Release = %v, %v; want no-op", held, err)
			}
			if got := hget(t, e.raw, s.Keys(ref).Lease, "o"); got != o[1].String() {
				t.Errorf("lease owner = %q, want %s", got, o[1])
			}
		}},
	}
}

func syncGenCases() []scriptCase {
	return []scriptCase{
		{name: "SyncGenRaisesCounterAndHoldersLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			// The database answered far above Redis's proposal (and its
			// clock term), so the next proposals rise by 1 from it.
			db := g + 1_000_000_000
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: db, Owner: o[0]}, retention); err != nil {
				t.Fatal(err)
			}
			k := s.Keys(ref)
			if got := get(t, e.raw, k.Gen); got != genOf(db) {
				t.Errorf("counter = %q, want %d", got, db)
			}
			if got := hget(t, e.raw, k.Lease, "g"); got != genOf(db) {
				t.Errorf("lease generation = %q, want %d", got, db)
			}
			// A re-run by the holder now reports the synced generation.
			acquireGen(t, s, ref, o[0], db)
			e.expire(t, k.Lease)
			acquireGen(t, s, ref, o[1], db+1)
		}},
		{name: "SyncGenNeverLowersCounter", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			base := acquire(t, s, ref, o)
			k := s.Keys(ref)
			for _, c := range []struct{ sync, want uint64 }{{9, 9}, {10, 10}, {9, 10}, {3, 10}, {0, 10}, {10, 10}, {100, 100}, {99, 100}} {
				to := base + c.sync
				if c.sync == 0 {
					to = 1 // far below
				}
				if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: to, Owner: o}, retention); err != nil {
					t.Fatal(err)
				}
				if got := get(t, e.raw, k.Gen); got != genOf(base+c.want) {
					t.Fatalf("counter = %q after SyncGen(%d), want %d", got, to, base+c.want)
				}
			}
		}},
		{name: "SyncGenLeavesOtherOwnersLease", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), owners(2)
			g := acquire(t, s, ref, o[0])
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g + 5, Owner: o[1]}, retention); err != nil {
				t.Fatal(err)
			}
			k := s.Keys(ref)
			if got := hget(t, e.raw, k.Lease, "g"); got != genOf(g) {
				t.Errorf("other owner's lease generation = %q, want %d", got, g)
			}
			if got := get(t, e.raw, k.Gen); got != genOf(g+5) {
				t.Errorf("counter = %q, want %d", got, g+5)
			}
		}},
		{name: "SyncGenCreatesLostCounterWithRetention", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref := refFor(t, "k")
			db := clockFloor(redisTime(t, e.raw)) + 1_000_000_000
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: db}, 10*time.Minute); err != nil {
				t.Fatal(err)
			}
			k := s.Keys(ref)
			if got := get(t, e.raw, k.Gen); got != genOf(db) {
				t.Errorf("counter = %q, want %d", got, db)
			}
			if d := pttl(t, e.raw, k.Gen); d <= 9*time.Minute || d > 10*time.Minute {
				t.Errorf("counter PTTL = %v, want about 10m", d)
			}
			if exists(t, e.raw, k.Lease) {
				t.Error("SyncGen without owner created a lease")
			}
			acquireGen(t, s, ref, uuid.New(), db+1)
		}},
		{name: "SyncGenKeepsLongerCounterTTL", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			g := acquire(t, s, ref, o)
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: g + 1}, time.Second); err != nil {
				t.Fatal(err)
			}
			if d := pttl(t, e.raw, s.Keys(ref).Gen); d <= time.Second {
				t.Errorf("counter PTTL = %v, want the 1h retention kept", d)
			}
		}},
		{name: "SyncGenKeepsGenerationsAbove2To53Exact", run: func(t *testing.T, e env, s *fastpath.Scripts) {
			ref, o := refFor(t, "k"), uuid.New()
			const big = 1<<62 + 1
			if err := s.SyncGen(context.Background(), ref, fence.Token{Generation: big}, retention); err != nil {
				t.Fatal(err)
			}
			acquireGen(t, s, ref, o, big+1)
			if got := get(t, e.raw, s.Keys(ref).Gen); got != "4611686018427387906" {
				t.Errorf("counter = %q", got)
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
				if err := e.raw.HSet(context.Background(), s.Keys(ref).Result, "f", fp, "g", "1", "d", "\x02garbage").Err(); err != nil {
					t.Fatal(err)
				}
				for range 3 {
					_, err := s.Claim(context.Background(), ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease, Retention: retention})
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
				if err := e.raw.Set(context.Background(), s.Keys(ref).Lease, "x", time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
				_, err := s.Claim(context.Background(), ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease, Retention: retention})
				if !errors.Is(err, fastpath.ErrUnavailable) || !strings.Contains(strings.ToUpper(err.Error()), "WRONGTYPE") {
					t.Fatalf("Claim on a string lease: %v, want ErrUnavailable with WRONGTYPE", err)
				}
			})
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
	good := fastpath.ClaimArgs{Fingerprint: fp, Owner: o, Lease: lease, Retention: retention}
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
		"ClaimNoRetention": func() error {
			_, err := s.Claim(ctx, ref, with(func(a *fastpath.ClaimArgs) { a.Retention = 0 }))
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
		"SyncGenGeneration0":    func() error { return s.SyncGen(ctx, ref, fence.Token{Owner: o}, retention) },
		"SyncGenShortRetention": func() error { return s.SyncGen(ctx, ref, fence.Token{Generation: 1, Owner: o}, 0) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, fastpath.ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
		})
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
