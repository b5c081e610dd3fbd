package claim

import (
	"sync/atomic"

	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// newGuess decides ClaimParams.ExpectNew for the durable claims Redis did
// not grant (no Redis, its breaker open, no answer), from how this
// Claimer's own such claims have gone lately.
//
// With ExpectNew, PostgreSQL sends a plain insert first and the full claim
// only if the insert found a record: a new key costs the server about a
// third less (190 against 300 µs per statement, DESIGN §5 step 3), a key
// that has a record costs one more round trip. When Redis granted the key
// the hint is always set (a record is unlikely). Without Redis's answer,
// the hint is set while new keys have been most of the recent claims: a
// score that a new record raises by 1 and a found one lowers by
// guessMiss, set from guessOn up. The hint changes only how many
// statements a claim takes, never its outcome (the store contract runs
// with the hint on every claim, TestContractExpectNew), so a wrong guess
// costs a round trip, nothing else.
type newGuess struct{ score atomic.Int32 }

const (
	// guessMax bounds the score, so a long run of new keys is forgotten
	// after a few found records.
	guessMax = 32
	// guessOn is the score from which the hint is set. A Claimer starts
	// at 0: the full claim first, as it always did, until guessOn new
	// keys in a row say otherwise.
	guessOn = 16
	// guessMiss is what a found record takes off the score. The hint
	// stays on while at least two claims in three are new: the insert
	// saves about 110 µs of server time on each new key and costs a
	// round trip (about 150 µs with its conflict check) on each found
	// one, so it pays from about 0.6.
	guessMiss = 2
)

// likely reports whether the next claim Redis did not grant should carry
// ExpectNew.
func (g *newGuess) likely() bool { return g.score.Load() >= guessOn }

// observe records the answer of a durable claim that Redis did not grant
// (p.Proposed is 0); it ignores the others, whose keys Redis had already
// told apart.
func (g *newGuess) observe(p storeapi.ClaimParams, res storeapi.ClaimResult) {
	if p.Proposed != 0 {
		return
	}
	step := int32(1)
	if !res.Acquired || res.Takeover || res.Restarted {
		step = -guessMiss // the scope had a record: the insert would have found it
	}
	for {
		s := g.score.Load()
		n := min(max(s+step, 0), guessMax)
		if n == s || g.score.CompareAndSwap(s, n) {
			return
		}
	}
}

// hint sets p's Redis proposal and ExpectNew for a durable claim after
// Redis answered f (or did not).
func (c *Claimer[TTx]) hint(p *storeapi.ClaimParams, f fast) {
	p.Proposed = f.proposed
	p.ExpectNew = f.proposed != 0 || c.guess.likely()
}
