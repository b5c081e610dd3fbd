package claim

import (
	"sync/atomic"

	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// newGuess tells, for the durable claims Redis did not grant (no Redis,
// its breaker open, no answer), whether keys have lately been new or
// already recorded, from how this Claimer's own such claims went.
//
// New keys: with ClaimParams.ExpectNew, PostgreSQL sends a plain insert
// first and the full claim only if the insert found a record: a new key
// costs the server about a third less (190 against 300 µs per statement,
// DESIGN §5 step 3), a recorded one a round trip more. When Redis granted
// the key the hint is always set (a record is unlikely).
//
// Recorded keys: Do then reads the record first, outside a transaction
// (readFirst, as a write at commit does): a finished record within its
// retention is replayed in one statement instead of BEGIN, the claim and
// COMMIT; any other answer costs the read more.
//
// One score holds both: a new record raises it by 1 and a found one lowers
// it by guessMiss, within ±guessMax. From guessOn up the hint is set; from
// -guessOn down Do reads first; in between (and at the start) Do does as it
// always did: the full claim in its transaction. Neither changes an
// outcome, only how many statements a claim takes (the store contract runs
// with the hint on every claim, TestContractExpectNew; a replay from the
// read is the one the claim statement's read-only path gives), so a wrong
// guess costs a round trip, nothing else.
type newGuess struct{ score atomic.Int32 }

const (
	// guessMax bounds the score both ways, so a long run of either kind
	// is forgotten after a few of the other.
	guessMax = 32
	// guessOn is the score from which the hint is set (and minus it, the
	// score to which Do reads first). A Claimer starts at 0: the full
	// claim in its transaction, as it always did, until guessOn new keys
	// in a row, or about half as many found records, say otherwise.
	guessOn = 16
	// guessMiss is what a found record takes off the score. The hint
	// stays on while at least two claims in three are new: the insert
	// saves about 110 µs of server time on each new key and costs a
	// round trip (about 150 µs with its conflict check) on each found
	// one, so it pays from about 0.6. Reading first stays on while more
	// than one claim in three finds a record: a replay saves two round
	// trips (BEGIN and COMMIT) and a new key costs one.
	guessMiss = 2
)

// likely reports whether the next claim Redis did not grant should carry
// ExpectNew.
func (g *newGuess) likely() bool { return g.score.Load() >= guessOn }

// recorded reports whether the next Do whose key Redis did not grant
// should read the record first.
func (g *newGuess) recorded() bool { return g.score.Load() <= -guessOn }

// observe records the answer of a durable claim that Redis did not grant
// (p.Proposed is 0); it ignores the others, whose keys Redis had already
// told apart.
func (g *newGuess) observe(p storeapi.ClaimParams, res storeapi.ClaimResult) {
	if p.Proposed != 0 {
		return
	}
	if !res.Acquired || res.Takeover || res.Restarted {
		g.add(-guessMiss) // the scope had a record: the insert would have found it
		return
	}
	g.add(1)
}

// observeRead records a read first (Do, Redis not granting) that found a
// finished record: a replay or a mismatch.
func (g *newGuess) observeRead() { g.add(-guessMiss) }

// add moves the score by step, within ±guessMax.
func (g *newGuess) add(step int32) {
	for {
		s := g.score.Load()
		n := min(max(s+step, -guessMax), guessMax)
		if n == s || g.score.CompareAndSwap(s, n) {
			return
		}
	}
}

// hint sets p's Redis proposal and ExpectNew for a durable claim after
// Redis answered f (or did not).
func (c *Claimer[TTx]) hint(p *storeapi.ClaimParams, f fast) {
	p.Proposed = f.proposed
	p.ExpectNew = f.proposed != 0 || c.newKeyGuess.likely()
}
