// Package fence defines the fencing token that every write made under an
// idempotency lease carries.
//
// A [Token] is a pair (generation, owner). The durable store assigns the
// generation when a worker claims a key. Generations only rise for a scope
// (tenant, operation, key), also across Sweep and retention restarts:
//
//   - inside the atomic claim the store computes GREATEST(proposed,
//     stored+1), so takeovers, releases and restarts never go back;
//   - a record the store creates or restarts also gets at least the
//     database's clock in milliseconds since the Unix epoch minus 60000, and
//     Sweep deletes a record only once its generation is below that clock
//     minus 120000, so a scope claimed again after its record was swept
//     starts above the swept generation.
//
// This rests on the database server's clock not stepping back by more than
// about a minute. The owner is a random UUID chosen by the worker for that
// one claim. Generations are large numbers (about 1.7e12 and rising), not a
// count of attempts: compare them, never count with them.
//
// # Why a number that only goes up
//
// A lease can end while its holder still runs: the process paused for a GC or
// a VM migration, the network stalled, or the lease simply expired. Another
// worker then takes the key over under a higher generation. When the first
// worker wakes up it still believes it owns the key. Without a fence its late
// write would overwrite the new owner's. With a fence, every write carries the
// token, and the receiving system accepts it only while that token is the
// current one: the durable store's fenced UPDATE matches owner AND generation,
// and zero rows means the writer is stale.
//
// # Using the generation downstream
//
// A downstream system (a ledger, a deploy controller, an object store) can
// enforce the same rule without knowing anything about this library:
//
//  1. Receive the token with each write, for example in a header:
//     Fencing-Token: 42.5f0c1c9e-8d1e-4a51-9a59-2a4a0f4f6a11 (see [Token.String]).
//  2. Parse it with [Parse] and keep, per resource, the highest generation it
//     has accepted.
//  3. Reject a write whose generation is lower than the one stored; accept
//     an equal one only from the same owner (the same Token, compared with
//     ==); store a higher one before applying the write, in the same
//     transaction.
//
// The generation orders writers; the owner tells two writers apart in the
// rare case where a data-losing Redis proposed one generation twice (the
// durable store lets only one of them through).
package fence

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// errInvalidToken is wrapped by every error of [Parse], its only failure.
var errInvalidToken = errors.New("fence: invalid token")

// Token is a fencing token: the generation of a claim and the owner that
// holds it. Tokens are comparable: two are the same token exactly when they
// are ==, the zero Token means "no token", and of two tokens the one with
// the higher Generation was issued later.
type Token struct {
	// Generation rises monotonically per idempotency key. It is at least 1 for
	// any token the durable store issued.
	Generation uint64
	// Owner is the random identity of the worker holding the claim.
	Owner uuid.UUID
}

// String returns the token as "<generation>.<owner>", for example
// "42.5f0c1c9e-8d1e-4a51-9a59-2a4a0f4f6a11". The form contains only digits,
// lowercase hex, '-' and '.', so it survives HTTP headers, URLs and logs, and
// [Parse] reads it back.
func (t Token) String() string {
	return strconv.FormatUint(t.Generation, 10) + "." + t.Owner.String()
}

// MarshalText implements encoding.TextMarshaler with the [Token.String] form.
func (t Token) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler; it accepts what [Parse] accepts.
func (t *Token) UnmarshalText(b []byte) error {
	p, err := Parse(string(b))
	if err != nil {
		return err
	}
	*t = p
	return nil
}

// Parse reads a token in the form written by [Token.String]. It returns an
// error ("fence: invalid token: ...", its only kind) for anything else,
// including a generation of 0, a generation with a sign or leading zeros,
// and a non-canonical UUID.
func Parse(s string) (Token, error) {
	gen, owner, ok := strings.Cut(s, ".")
	if !ok || gen == "" || (len(gen) > 1 && gen[0] == '0') {
		return Token{}, fmt.Errorf("%w: %q", errInvalidToken, s)
	}
	for i := 0; i < len(gen); i++ {
		if gen[i] < '0' || gen[i] > '9' {
			return Token{}, fmt.Errorf("%w: %q", errInvalidToken, s)
		}
	}
	g, err := strconv.ParseUint(gen, 10, 64)
	if err != nil || g == 0 {
		return Token{}, fmt.Errorf("%w: generation in %q", errInvalidToken, s)
	}
	if len(owner) != 36 {
		return Token{}, fmt.Errorf("%w: owner in %q", errInvalidToken, s)
	}
	u, err := uuid.Parse(owner)
	if err != nil || u.String() != owner {
		return Token{}, fmt.Errorf("%w: owner in %q", errInvalidToken, s)
	}
	return Token{Generation: g, Owner: u}, nil
}
