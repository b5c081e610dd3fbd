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
	if prefix == "" {
		prefix = DefaultPrefix
	}
	d := ref.Digest()
	// prefix + ":{" + 64 hex + "}:" + suffix, built in one buffer.
	b := make([]byte, 0, len(prefix)+2+hex.EncodedLen(len(d))+2)
	b = append(b, prefix...)
	b = append(b, ":{"...)
	b = hex.AppendEncode(b, d[:])
	b = append(b, "}:"...)
	base := string(b)
	return Keys{Lease: base + "lease", Gen: base + "gen", Result: base + "result"}
}
