package fastpath

import (
	"encoding/hex"

	"github.com/oncekey/oncekey/durable"
)

// DefaultPrefix is the key prefix used when [Options.Prefix] is empty.
const DefaultPrefix = "oncekey"

// Keys are the Redis keys of one idempotency key: one since layout v2.
type Keys struct {
	// Record is a string holding the record's lease or its finished result,
	// with a PX TTL of the lease or of the cached copy's retention. lua's
	// claim.lua header gives the two forms.
	Record string
}

// Wake returns the shard channel on which complete.lua and release.lua
// announce that the key's holder finished or let go: the record key with
// ":wake" appended, in the same Redis Cluster slot.
func (k Keys) Wake() string { return k.Record + ":wake" }

// KeysFor returns the keys of ref under prefix (DefaultPrefix when empty):
//
//	<prefix>:{<h>}:rec
//
// where h is the 64 lowercase hex digits of [durable.Ref.Digest], a SHA-256
// over the length-prefixed tenant, operation and key hash. No tenant,
// operation or key appears in the name, and since only hex sits between
// the braces, a client key containing '{' or '}' cannot move the slot.
// KeysFor does not validate prefix; [New] rejects one with braces.
func KeysFor(prefix string, ref durable.Ref) Keys {
	return keysAt(prefix, ref.Digest())
}

// keysAt returns the keys of the record whose [durable.Ref.Digest] is d,
// built in one allocation.
func keysAt(prefix string, d [32]byte) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	var buf [192]byte // on the stack: prefixes up to 120 bytes fit
	b := append(buf[:0], prefix...)
	b = append(b, ":{"...)
	b = hex.AppendEncode(b, d[:])
	b = append(b, "}:rec"...)
	return Keys{Record: string(b)}
}
