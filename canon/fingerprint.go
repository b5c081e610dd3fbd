package canon

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"
)

// Fingerprint identifies a request's intent: "v1:" followed by the unpadded
// base64url encoding of a SHA-256 digest (46 characters in all). The version
// prefix names the canonical form that was hashed, so fingerprints of a
// future form can be stored beside v1 ones without being mistaken for them.
// Two fingerprints are equal exactly when their strings are.
type Fingerprint string

// version is the current canonical form.
const version = "v1"

// Domain separation tags: a request fingerprint and a [Sum] of the same
// bytes can never be equal.
const (
	tagRequest = "oncekey/canon/v1/request\x00"
	tagSum     = "oncekey/canon/v1/sum\x00"
)

// Version returns the canonical-form version, "v1" for every fingerprint
// this version of the package makes, or "" if f has no version prefix.
func (f Fingerprint) Version() string {
	v, _, ok := strings.Cut(string(f), ":")
	if !ok {
		return ""
	}
	return v
}

// Sum returns the fingerprint of parts, for callers outside HTTP: pass
// canonical bytes, such as the output of [JSONStrict] and an operation name.
// Each part is length-prefixed before hashing, so Sum([]byte("ab"),
// []byte("c")) differs from Sum([]byte("a"), []byte("bc")); and Sum is
// domain-separated from [Request], so the two never collide.
func Sum(parts ...[]byte) Fingerprint {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte(tagSum))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(parts)))])
	for _, part := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		h.Write(part)
	}
	var sum [sha256.Size]byte
	return encode(h.Sum(sum[:0]))
}

func encode(digest []byte) Fingerprint {
	const n = len(version) + 1
	var buf [n + 43]byte // base64.RawURLEncoding.EncodedLen(32) == 43
	copy(buf[:], version+":")
	base64.RawURLEncoding.Encode(buf[n:], digest)
	return Fingerprint(buf[:])
}
