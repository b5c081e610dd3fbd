package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// TestLeaseWatch_Takeovers is the leases watch's negative control: a
// takeover that returned before the lease could have run out is a
// violation; one after is not, and is explained by how long its owner had
// been silent (a stall past the lease, or renewals that did not land).
func TestLeaseWatch_Takeovers(t *testing.T) {
	const lease = 300 * time.Millisecond
	key := [32]byte{1}
	e := &env{keyspace: map[[32]byte]string{key: "k"}}
	f := newLeaseFloors()
	w := &leaseWatch{e: e, f: f}
	t0 := time.Now()
	grant := func(gen uint64, takeover bool, start, end time.Duration) {
		res := storeapi.ClaimResult{Acquired: true, Takeover: takeover, Token: fence.Token{Generation: gen, Owner: uuid.New()}}
		res.Ref.KeyHash = key
		w.acquired(res, t0.Add(start), t0.Add(end), lease, true)
	}

	grant(1, false, 0, 10*time.Millisecond)
	// Generation 1's owner never renewed: taken over 900ms after its
	// claim was sent, three leases.
	grant(2, true, 890*time.Millisecond, 900*time.Millisecond)
	if len(e.extra) != 0 {
		t.Fatalf("a takeover after the lease ran out was reported: %+v", e.extra)
	}
	got := f.explain(key, lease)
	if !strings.Contains(got, "generation 2 took over generation 1") || !strings.Contains(got, "the process stalled") {
		t.Fatalf("explain = %q, want generation 1's stall", got)
	}

	// Generation 2's owner sent a renewal 310ms after its claim, which
	// did not land; taken over 240ms after that renewal was sent, past
	// its lease: "none landed".
	f.mu.Lock()
	f.tried[f.m[key].tok] = t0.Add(1200 * time.Millisecond)
	f.mu.Unlock()
	grant(3, true, 1430*time.Millisecond, 1440*time.Millisecond)
	if got := f.explain(key, lease); !strings.Contains(got, "generation 3 took over generation 2") || !strings.Contains(got, "none landed in time") {
		t.Fatalf("explain = %q, want generation 2's renewals that did not land", got)
	}

	// A takeover 100ms after generation 3's claim: its lease was live.
	grant(4, true, 1500*time.Millisecond, 1540*time.Millisecond)
	if len(e.extra) != 1 || e.extra[0].Invariant != noLiveLeaseTakeover {
		t.Fatalf("violations = %+v, want one %s", e.extra, noLiveLeaseTakeover)
	}
}
