package fastpath_test

import (
	"context"
	"maps"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// TestScripts_ServerCalls counts, with INFO commandstats on a private
// server, the commands each request sends Redis (EVALSHA and every call
// inside the script). Fewer is the goal of issue 30; these exact counts
// keep a change from adding one unnoticed. A change that removes one
// updates them, and the counts in the scripts' headers.
func TestScripts_ServerCalls(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	s, err := fastpath.New(c, fastpath.Options{Prefix: "calls", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Load(ctx); err != nil { // EVALSHA finds every script
		t.Fatal(err)
	}
	ref := durable.Scope{Tenant: "t", Operation: "op", Key: "k"}.Ref(nil)
	ref2 := durable.Scope{Tenant: "t", Operation: "op", Key: "k2"}.Ref(nil)
	o1, o2 := uuid.New(), uuid.New()
	claim := func(ref durable.Ref, o uuid.UUID, withTTL bool) fastpath.ClaimReply {
		t.Helper()
		r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: o, Lease: lease, WithTTL: withTTL})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var gen, gen2 uint64
	steps := []struct {
		name string
		run  func()
		want map[string]int
	}{
		{"FreshClaim", func() {
			r := claim(ref, o1, false)
			if r.Status != fastpath.ClaimAcquired {
				t.Fatalf("fresh claim = %v", r.Status)
			}
			gen = r.Generation
		}, map[string]int{"evalsha": 1, "get": 1, "time": 1, "set": 1}},
		{"ReRun", func() { // the same claim again (a retried reply): no new proposal
			if r := claim(ref, o1, false); r.Status != fastpath.ClaimAcquired || r.Generation != gen {
				t.Fatalf("re-run = %+v, want acquired at %d", r, gen)
			}
		}, map[string]int{"evalsha": 1, "get": 1}},
		{"TentativeDuplicate", func() {
			if r := claim(ref, o2, false); r.Status != fastpath.ClaimBusy || !r.Tentative || r.Lease != lease {
				t.Fatalf("duplicate = %+v, want busy, tentative, with the holder's lease length", r)
			}
		}, map[string]int{"evalsha": 1, "get": 1}},
		{"Confirm", func() { // the durable store granted the key
			if err := s.SyncGen(ctx, ref, fence.Token{Generation: gen, Owner: o1}); err != nil {
				t.Fatal(err)
			}
		}, map[string]int{"evalsha": 1, "get": 1, "set": 1}},
		{"BusyDuplicate", func() {
			if r := claim(ref, o2, false); r.Status != fastpath.ClaimBusy || r.Tentative || r.Lease != lease || r.Age < 0 || r.Age > 5*time.Second {
				t.Fatalf("duplicate = %+v, want busy, confirmed, with the holder's lease length and its age", r)
			}
		}, map[string]int{"evalsha": 1, "get": 1, "pttl": 1}},
		{"Renew", func() {
			if held, err := s.Renew(ctx, ref, fence.Token{Generation: gen, Owner: o1}, lease); err != nil || !held {
				t.Fatalf("renew = %v, %v", held, err)
			}
		}, map[string]int{"evalsha": 1, "get": 1, "pexpire": 1}},
		{"SyncGen", func() {
			gen += 5
			if err := s.SyncGen(ctx, ref, fence.Token{Generation: gen, Owner: o1}); err != nil {
				t.Fatal(err)
			}
		}, map[string]int{"evalsha": 1, "get": 1, "set": 1}},
		{"SyncGenWithoutOwner", func() { // no lease to rewrite: no call
			if err := s.SyncGen(ctx, ref, fence.Token{Generation: gen}); err != nil {
				t.Fatal(err)
			}
		}, map[string]int{}},
		{"Complete", func() {
			if cached, err := s.Complete(ctx, ref, fence.Token{Generation: gen, Owner: o1}, fp, durable.Completed, sampleResult(), time.Hour); err != nil || !cached {
				t.Fatalf("complete = %v, %v", cached, err)
			}
		}, map[string]int{"evalsha": 1, "get": 1, "set": 1, "spublish": 1}},
		{"Replay", func() {
			if r := claim(ref, o2, false); r.Status != fastpath.ClaimCached {
				t.Fatalf("replay = %v, want cached", r.Status)
			}
		}, map[string]int{"evalsha": 1, "get": 1}},
		{"ReplayWithTTL", func() { // the replay cache in process asks for the copy's TTL
			r := claim(ref, o2, true)
			if r.Status != fastpath.ClaimCached || r.Cached.TTL <= 0 || r.Cached.TTL > time.Hour {
				t.Fatalf("replay with TTL = %+v; want cached with a TTL in (0, 1h]", r)
			}
		}, map[string]int{"evalsha": 1, "get": 1, "pttl": 1}},
		{"FreshClaimOtherKey", func() {
			r := claim(ref2, o1, false)
			if r.Status != fastpath.ClaimAcquired {
				t.Fatalf("fresh claim = %v", r.Status)
			}
			gen2 = r.Generation
		}, map[string]int{"evalsha": 1, "get": 1, "time": 1, "set": 1}},
		{"Release", func() {
			if held, err := s.Release(ctx, ref2, fence.Token{Generation: gen2, Owner: o1}); err != nil || !held {
				t.Fatalf("release = %v, %v", held, err)
			}
		}, map[string]int{"evalsha": 1, "get": 1, "del": 1, "spublish": 1}},
	}
	sums := map[string]int{}
	for _, st := range steps {
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		st.run()
		got := commandCalls(t, c)
		if !maps.Equal(got, st.want) {
			t.Errorf("%s: server calls %v, want %v", st.name, got, st.want)
		}
		for _, n := range got {
			sums[st.name] += n
		}
	}
	// Issue 30's row: 18 for a fresh claim + complete before, <= 8 asked;
	// a busy duplicate <= 2. Issue 43 adds the wake that complete.lua
	// publishes (1 call, in the script) and the confirmation (3 calls),
	// which the claimer sends off the caller's path, concurrently with the
	// work: the caller waits for 2 round trips, 8 calls of the 11.
	if n := sums["FreshClaim"] + sums["Complete"]; n != 8 {
		t.Errorf("fresh claim + complete: %d server calls, want 8 (issue 30: at most 8)", n)
	}
	if n := sums["FreshClaim"] + sums["Confirm"] + sums["Complete"]; n != 11 {
		t.Errorf("fresh claim + confirmation + complete: %d server calls, want 11", n)
	}
	// Issue 43 adds the confirmed lease's PTTL (its age decides whether
	// Redis may answer "in progress" alone): 3, in the one round trip.
	if n := sums["BusyDuplicate"]; n != 3 {
		t.Errorf("busy duplicate: %d server calls, want 3 (issue 30: 2, before the age)", n)
	}
	if n := sums["TentativeDuplicate"]; n > 2 {
		t.Errorf("duplicate of a tentative lease: %d server calls, want at most 2", n)
	}
}

var cmdstat = regexp.MustCompile(`(?m)^cmdstat_([a-z|]+):calls=(\d+)`)

// commandCalls reads INFO commandstats: calls per command since the last
// CONFIG RESETSTAT, without the CONFIG and INFO of the count itself.
func commandCalls(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, m := range cmdstat.FindAllStringSubmatch(info, -1) {
		if m[1] == "info" || m[1] == "config|resetstat" {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		got[m[1]] = n
	}
	return got
}
