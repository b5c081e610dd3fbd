package history

import (
	"slices"
	"testing"
	"time"
)

// TestSampler_KeepsChangesOnly: repeated readings of one generation are
// kept once, and a decrease is kept (the checker compares consecutive
// samples of a key, so it still sees it).
func TestSampler_KeepsChangesOnly(t *testing.T) {
	s := &Sampler{last: map[string]uint64{}}
	for i, r := range []struct {
		key string
		gen uint64
	}{{"a", 5}, {"b", 1}, {"a", 5}, {"a", 5}, {"a", 7}, {"b", 1}, {"a", 7}, {"a", 6}, {"a", 6}} {
		s.add(r.key, time.Duration(i), r.gen)
	}
	var got []uint64
	for _, x := range s.samples {
		if x.Key == "a" {
			got = append(got, x.Generation)
		}
	}
	if !slices.Equal(got, []uint64{5, 7, 6}) || len(s.samples) != 4 {
		t.Fatalf("samples %+v: want a: 5, 7, 6 and b once", s.samples)
	}
	if s.samples[3].At != 7 {
		t.Fatalf("the decrease is kept at the time of its first reading (7), got %v", s.samples[3].At)
	}
}
