package durable

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"log/slog"
)

// Limits on a [Scope], in bytes.
const (
	maxKeyLen  = 255
	maxNameLen = 512
)

// Scope names one logical operation: who asks (Tenant), what (Operation) and
// which attempt family (Key, the client's idempotency key).
//
// Tenant must come from authentication. Two tenants, or two operations, with
// the same Key never interact.
type Scope struct {
	Tenant    string
	Operation string
	Key       string
}

// Validate checks the scope: tenant and operation non-empty valid UTF-8 of at
// most 512 bytes without control characters (C0 U+0000 to U+001F,
// DEL U+007F, C1 U+0080 to U+009F) nor U+FFFD; key 1 to 255
// bytes of printable ASCII (0x20 to 0x7E). Its error matches
// [ErrInvalidScope] and names the field and why.
func (s Scope) Validate() error {
	if err := validName("tenant", s.Tenant); err != nil {
		return err
	}
	if err := validName("operation", s.Operation); err != nil {
		return err
	}
	return ValidateKey(s.Key)
}

// ValidateKey checks an idempotency key alone: 1 to 255 bytes of
// printable ASCII. Its error matches [ErrInvalidScope] and names the
// field "key".
func ValidateKey(key string) error {
	switch {
	case key == "":
		return &scopeError{field: "key", reason: "empty"}
	case len(key) > maxKeyLen:
		return &scopeError{field: "key", reason: "longer than 255 bytes"}
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return &scopeError{field: "key", reason: "not printable ASCII"}
		}
	}
	return nil
}

func validName(field, v string) error {
	if v == "" {
		return &scopeError{field: field, reason: "empty"}
	}
	if len(v) > maxNameLen {
		return &scopeError{field: field, reason: "too long"}
	}
	for _, r := range v {
		// utf8.RuneError (U+FFFD) is also what ranging yields for an
		// invalid byte, so invalid UTF-8 is rejected here too.
		if r == 0xFFFD || r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return &scopeError{field: field, reason: "invalid UTF-8 or control character"}
		}
	}
	return nil
}

// LogValue implements slog.LogValuer: it logs tenant and operation hashed
// and never the key, so a Scope can be passed to a logger safely.
func (s Scope) LogValue() slog.Value {
	return slog.StringValue("scope:" + s.Ref(nil).OperationID())
}

// Ref returns the stored identity of s. secret, when non-empty, turns the
// key hash into HMAC-SHA-256(secret, key); a backend configured with a
// secret must use the same one every time. Ref does not validate s.
func (s Scope) Ref(secret []byte) Ref {
	var sum []byte
	if len(secret) > 0 {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(s.Key))
		sum = m.Sum(nil)
	} else {
		h := sha256.Sum256([]byte(s.Key))
		sum = h[:]
	}
	var r Ref
	r.Tenant, r.Operation = s.Tenant, s.Operation
	copy(r.KeyHash[:], sum)
	return r
}

// Ref is the stored identity of a record: tenant, operation and the hash of
// the key. It is the primary key of the record.
type Ref struct {
	Tenant    string
	Operation string
	KeyHash   [32]byte
}

// Digest returns SHA-256 over the length-prefixed tenant, operation and key
// hash. Each field is preceded by its length, so no two different Refs share
// a digest input. It names the record in places that must not show the
// tenant, operation or key: Redis key names and [Ref.OperationID].
func (r Ref) Digest() [32]byte {
	h := sha256.New()
	var n [8]byte
	for _, f := range [][]byte{[]byte("oncekey/ref/v1"), []byte(r.Tenant), []byte(r.Operation), r.KeyHash[:]} {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// OperationID returns a stable identity for the logical operation: the same
// for every retry and every takeover of the scope, different for any other
// tenant, operation or key. Pass it downstream as that system's idempotency
// key. It reveals nothing of the key: "op_" followed by 43 base64url
// characters.
func (r Ref) OperationID() string {
	d := r.Digest()
	return "op_" + base64.RawURLEncoding.EncodeToString(d[:])
}

// LogValue implements slog.LogValuer with the operation identity.
func (r Ref) LogValue() slog.Value { return slog.StringValue(r.OperationID()) }

// String returns the operation identity; it never shows the key hash.
func (r Ref) String() string { return r.OperationID() }
