package fastpath

import (
	"testing"
	"time"
)

// A completion that waited for a turn on the pool caches its result for
// that much less: its TTL was measured when the call was made, so that the
// cached copy never outlives the record (claim subtracts only the per-call
// timeout for the delay before the script runs).
func TestCallShorten(t *testing.T) {
	for _, tc := range []struct {
		ttl    int64
		waited time.Duration
		want   int64
	}{
		{ttl: 1000, waited: 0, want: 1000},
		{ttl: 1000, waited: 250 * time.Millisecond, want: 750},
		{ttl: 1000, waited: 250*time.Millisecond + time.Microsecond, want: 749}, // rounded up
		{ttl: 1000, waited: 999 * time.Millisecond, want: 1},
		{ttl: 1000, waited: time.Second, want: 0}, // caches nothing
		{ttl: 1000, waited: time.Hour, want: 0},
	} {
		c := newCall("rec")
		c.int(tc.ttl)
		c.ttl = &c.ints[c.ni-1]
		c.shorten(tc.waited)
		if got := *c.args[c.n-1].(*int64); got != tc.want {
			t.Errorf("ttl %d after waiting %v = %d, want %d", tc.ttl, tc.waited, got, tc.want)
		}
	}
	// A call with no TTL argument is left as it is.
	c := newCall("rec")
	c.int(1000)
	c.shorten(time.Second)
	if got := *c.args[c.n-1].(*int64); got != 1000 {
		t.Errorf("argument of a call with no TTL = %d, want 1000", got)
	}
}
