package broken_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/broken"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// claims sends n claim.lua calls at once on n keys through a client of
// pool size 4, so that the fast path's gate sends some of them in
// pipelines, and returns the first byte of each key's value afterwards
// and whether a second owner's claim of each is told the lease is
// tentative.
func claims(t *testing.T, take bool, n int) (kinds []byte, tentative []bool, confirmed int64) {
	t.Helper()
	_, prefix := testenv.Redis(t) // the prefix, its keys deleted at the end
	opt := testenv.RedisOptions(t)
	opt.ContextTimeoutEnabled, opt.PoolSize = true, 4
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	var nc atomic.Int64
	if take && !broken.TakeLeases(rdb, func() { nc.Add(1) }) {
		t.Fatal("TakeLeases refused a go-redis client")
	}
	s, err := fastpath.New(rdb, fastpath.Options{Prefix: prefix, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	refs := make([]durable.Ref, n)
	var wg sync.WaitGroup
	for i := range refs {
		refs[i] = durable.Scope{Tenant: "t", Operation: "o", Key: fmt.Sprint(i)}.Ref(nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := s.Claim(t.Context(), refs[i], fastpath.ClaimArgs{Fingerprint: "fp", Owner: uuid.New(), Lease: time.Minute})
			if err != nil || rep.Status != fastpath.ClaimAcquired {
				t.Errorf("claim %d = %+v, %v; want acquired", i, rep, err)
			}
		}()
	}
	wg.Wait()
	for _, ref := range refs {
		v, err := rdb.Get(t.Context(), s.Keys(ref).Record).Result()
		if err != nil || v == "" {
			t.Fatalf("GET: %q, %v", v, err)
		}
		kinds = append(kinds, v[0])
		rep, err := s.Claim(t.Context(), ref, fastpath.ClaimArgs{Fingerprint: "fp", Owner: uuid.New(), Lease: time.Minute})
		if err != nil || rep.Status != fastpath.ClaimBusy {
			t.Fatalf("second owner's claim = %+v, %v; want busy", rep, err)
		}
		tentative = append(tentative, rep.Tentative)
	}
	return kinds, tentative, nc.Load()
}

// Without the hook, claim.lua's leases are tentative until the durable
// store grants them (issue 43); with it, every lease claim.lua grants is
// confirmed before its reply reaches the caller, pipelined calls too, and
// a second owner is told the key is busy with a confirmed lease: "in
// progress", as before the fix.
func TestTakeLeases(t *testing.T) {
	const n = 32
	for _, take := range []bool{false, true} {
		t.Run(fmt.Sprintf("take=%v", take), func(t *testing.T) {
			kinds, tentative, confirmed := claims(t, take, n)
			want, wantTentative, wantConfirmed := byte('T'), true, int64(0)
			if take {
				want, wantTentative, wantConfirmed = 'L', false, n
			}
			for i := range kinds {
				if kinds[i] != want || tentative[i] != wantTentative {
					t.Errorf("key %d: value starts with %q, busy tentative=%v; want %q, %v", i, kinds[i], tentative[i], want, wantTentative)
				}
			}
			if confirmed != wantConfirmed {
				t.Errorf("%d leases confirmed, want %d", confirmed, wantConfirmed)
			}
		})
	}
}
