package fastpath

import (
	"encoding/hex"

	"github.com/oncekey/oncekey/durable"
)

// DefaultPrefix is the key prefix used when [Options.Prefix] is empty.
const DefaultPrefix = "oncekey"

// Keys are the three Redis keys of one idempotency key. All three carry the
// same hash tag, so they live in one Redis Cluster slot and one script can
// use them together.
type Keys struct {
	// Lease is a hash {o: owner, g: generation, f: fingerprint} with a PX
	// TTL: the fast-path lease.
	Lease string
	// Gen is the generation counter, a decimal integer kept at least for
	// the retention.
	Gen string
	// Result is a hash {f: fingerprint, g: generation, d: encoded result}
	// with a TTL no longer than the record's remaining retention.
	Result string
}

// KeysFor returns the keys of ref under prefix (DefaultPrefix when empty):
//
//	<prefix>:{<h>}:lease
//	<prefix>:{<h>}:gen
//	<prefix>:{<h>}:result
//
// where h is the 64 lowercase hex digits of [durable.Ref.Digest], a SHA-256
// over the length-prefixed tenant, operation and key hash. No tenant,
// operation or key appears in the names, and since only hex sits between
// the braces, a client key containing '{' or '}' cannot move the slot.
// KeysFor does not validate prefix; [New] rejects one with braces.
func KeysFor(prefix string, ref durable.Ref) Keys {
	return keysAt(prefix, ref.Digest())
}

// keysAt returns the keys of the record whose [durable.Ref.Digest] is d. The
// three names are cut from one string, built in one allocation.
func keysAt(prefix string, d [32]byte) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	const lease, gen, result = "lease", "gen", "result"
	// base = prefix + ":{" + 64 hex + "}:"; the names are base+lease,
	// base+gen and base+result, one after the other.
	base := len(prefix) + 2 + hex.EncodedLen(len(d)) + 2
	var buf [384]byte // on the stack: prefixes up to 50 bytes fit
	b := buf[:0]
	for _, suffix := range [...]string{lease, gen, result} {
		b = append(b, prefix...)
		b = append(b, ":{"...)
		b = hex.AppendEncode(b, d[:])
		b = append(b, "}:"...)
		b = append(b, suffix...)
	}
	all := string(b)
	i, j := base+len(lease), 2*base+len(lease)+len(gen)
	return Keys{Lease: all[:i], Gen: all[i:j], Result: all[j:]}
}
