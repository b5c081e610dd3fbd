package fastpath

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
)

// TestParseClaim_CachedTTL: a cached reply carries the copy's PTTL when the
// claim asked for it; a copy without a TTL (PTTL -1) gives no bound, and a
// fifth element that is not an integer is corrupt.
func TestParseClaim_CachedTTL(t *testing.T) {
	blob := encodeResultString(durable.Completed, durable.Result{StatusCode: 201, Body: []byte("{}")})
	for _, tc := range []struct {
		name    string
		reply   []any
		wantTTL time.Duration
		corrupt bool
	}{
		{"not asked", []any{"cached", "fp", "7", blob}, 0, false},
		{"asked", []any{"cached", "fp", "7", blob, int64(1500)}, 1500 * time.Millisecond, false},
		{"no TTL on the copy", []any{"cached", "fp", "7", blob, int64(-1)}, 0, false},
		{"not an integer", []any{"cached", "fp", "7", blob, "1500"}, 0, true},
		{"too long", []any{"cached", "fp", "7", blob, int64(1), int64(2)}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseClaim(tc.reply)
			if tc.corrupt {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("parseClaim = %+v, %v; want ErrCorrupt", r, err)
				}
				return
			}
			if err != nil || r.Status != ClaimCached || r.Cached.TTL != tc.wantTTL || r.Cached.Generation != 7 || string(r.Cached.Result.Body) != "{}" {
				t.Fatalf("parseClaim = %+v, %v; want cached with TTL %v", r, err, tc.wantTTL)
			}
		})
	}
}

// TestParseClaim_Finished: a finished marker's reply carries its
// generation; anything else is corrupt.
func TestParseClaim_Finished(t *testing.T) {
	if r, err := parseClaim([]any{"finished", "9"}); err != nil || r.Status != ClaimFinished || r.Generation != 9 {
		t.Fatalf("parseClaim = %+v, %v; want finished at 9", r, err)
	}
	for _, bad := range [][]any{{"finished"}, {"finished", "0"}, {"finished", "9", "x"}} {
		if _, err := parseClaim(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("parseClaim(%v) = %v; want ErrCorrupt", bad, err)
		}
	}
}

// TestParseClaim_BusyLease: a busy reply carries the holder's lease length
// (claim.lua's lease_ms, from the record), not a PTTL.
func TestParseClaim_BusyLease(t *testing.T) {
	owner := uuid.New()
	for _, tc := range []struct {
		name      string
		reply     []any
		wantLease time.Duration
		wantSame  bool
		wantTent  bool
		corrupt   bool
	}{
		{"same request", []any{"busy", "7", owner.String(), int64(30000), int64(1), int64(0), int64(29000)}, 30 * time.Second, true, false, false},
		{"other request", []any{"busy", "7", owner.String(), int64(1500), int64(0), int64(0), int64(-1)}, 1500 * time.Millisecond, false, false, false},
		{"tentative", []any{"busy", "7", owner.String(), int64(1500), int64(1), int64(1), int64(-1)}, 1500 * time.Millisecond, true, true, false},
		{"lease not an integer", []any{"busy", "7", owner.String(), "1500", int64(0), int64(0), int64(-1)}, 0, false, false, true},
		{"owner not a uuid", []any{"busy", "7", "short", int64(1500), int64(0), int64(0), int64(-1)}, 0, false, false, true},
		{"generation 0", []any{"busy", "0", owner.String(), int64(1500), int64(0), int64(0), int64(-1)}, 0, false, false, true},
		{"tentative not an integer", []any{"busy", "7", owner.String(), int64(1500), int64(0), "1", int64(-1)}, 0, false, false, true},
		{"pttl not an integer", []any{"busy", "7", owner.String(), int64(1500), int64(1), int64(0), "1"}, 0, false, false, true},
		{"too short", []any{"busy", "7", owner.String(), int64(1500), int64(0), int64(0)}, 0, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseClaim(tc.reply)
			if tc.corrupt {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("parseClaim = %+v, %v; want ErrCorrupt", r, err)
				}
				return
			}
			if err != nil || r.Status != ClaimBusy || r.Generation != 7 || r.Owner != owner || r.Lease != tc.wantLease || r.SameRequest != tc.wantSame || r.Tentative != tc.wantTent {
				t.Fatalf("parseClaim = %+v, %v; want busy by %s at 7, lease %v, same %v, tentative %v", r, err, owner, tc.wantLease, tc.wantSame, tc.wantTent)
			}
		})
	}
}
