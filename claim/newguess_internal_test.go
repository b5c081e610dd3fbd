package claim

import (
	"testing"

	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// The guess sets the hint from guessOn new keys in a row, drops it once
// found records outweigh new keys two to one, reads first once found
// records are about half of guessOn ahead, ignores the claims Redis
// granted, and stays within ±guessMax.
func TestNewGuess(t *testing.T) {
	var g newGuess
	none := storeapi.ClaimParams{}
	granted := storeapi.ClaimParams{Proposed: 7}
	fresh := storeapi.ClaimResult{Acquired: true}
	found := []storeapi.ClaimResult{{}, {Acquired: true, Takeover: true}, {Acquired: true, Restarted: true}}

	for i := range guessOn {
		if g.likely() {
			t.Fatalf("hint set after %d new keys; want it from %d", i, guessOn)
		}
		g.observe(none, fresh)
	}
	if !g.likely() {
		t.Fatalf("hint not set after %d new keys", guessOn)
	}
	// Claims Redis granted say nothing about the keys it does not answer for.
	for range 100 {
		g.observe(granted, found[0])
	}
	if !g.likely() || g.score.Load() != guessOn {
		t.Fatalf("score %d after claims Redis granted; want %d, unchanged", g.score.Load(), guessOn)
	}
	// Each kind of found record (existing, taken over, restarted) counts.
	for _, res := range found {
		g.score.Store(guessOn)
		g.observe(none, res)
		if g.likely() {
			t.Fatalf("hint still set after a found record %+v at the threshold", res)
		}
	}
	// Two new keys for each found one keep it on; fewer do not.
	g.score.Store(guessOn)
	for range 50 {
		g.observe(none, fresh)
		g.observe(none, fresh)
		g.observe(none, found[0])
	}
	if !g.likely() {
		t.Fatalf("hint off with two new keys for each found one (score %d)", g.score.Load())
	}
	for range 50 {
		g.observe(none, fresh)
		g.observe(none, found[0])
	}
	if g.likely() {
		t.Fatalf("hint on with one new key for each found one (score %d)", g.score.Load())
	}
	for range 100 {
		g.observe(none, fresh)
	}
	if s := g.score.Load(); s != guessMax {
		t.Fatalf("score %d after a long run of new keys; want the bound %d", s, guessMax)
	}
	for range 100 {
		g.observe(none, found[0])
	}
	if s := g.score.Load(); s != -guessMax || !g.recorded() || g.likely() {
		t.Fatalf("score %d after a long run of found records; want %d, reading first", s, -guessMax)
	}

	// From the start, guessOn/guessMiss found records make Do read first;
	// reads that find a record count like claims that do.
	var r newGuess
	for i := range guessOn / guessMiss {
		if r.recorded() {
			t.Fatalf("reading first after %d found records; want it from %d", i, guessOn/guessMiss)
		}
		if i%2 == 0 {
			r.observe(none, found[1])
		} else {
			r.observeRead()
		}
	}
	if !r.recorded() {
		t.Fatalf("not reading first after %d found records (score %d)", guessOn/guessMiss, r.score.Load())
	}
	// One found record in three keeps it; one in four does not.
	for range 50 {
		r.observeRead()
		r.observe(none, fresh)
		r.observe(none, fresh)
	}
	if !r.recorded() {
		t.Fatalf("not reading first with one found record in three (score %d)", r.score.Load())
	}
	for range 50 {
		r.observeRead()
		r.observe(none, fresh)
		r.observe(none, fresh)
		r.observe(none, fresh)
	}
	if r.recorded() {
		t.Fatalf("reading first with one found record in four (score %d)", r.score.Load())
	}
}
