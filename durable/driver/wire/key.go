// Package wire holds what the server middleware (claimhttp) and the client
// transport (claimclient) share and neither exports: the default key field,
// the problem media type and the key's encoding on the wire. The response
// fields and problem types are exported once, by claimclient, which
// claimhttp imports.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package wire

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/oncekey/oncekey/durable"
)

// Header is the default field that carries the idempotency key.
const Header = "Idempotency-Key"

// ProblemContentType is the media type of every error response the
// middleware writes (RFC 9457).
const ProblemContentType = "application/problem+json"

var (
	// ErrKeyMissing is returned by [ParseKey] when the request carries no
	// idempotency key field.
	ErrKeyMissing = errors.New("wire: idempotency key missing")

	// ErrKeyInvalid is returned by [ParseKey] for a key that is neither an
	// RFC 8941 sf-string nor a bare key, that is sent on more than one
	// field line, or that is not 1 to 255 printable ASCII characters after
	// unquoting, and by [FormatKey] for a key it cannot encode. The message
	// never quotes the key.
	ErrKeyInvalid = errors.New("wire: idempotency key invalid")
)

// ParseKey returns the idempotency key carried by the field name of h
// (canonicalized; [Header] when name is empty).
//
// The field must appear on exactly one field line. Its value, with
// surrounding spaces and tabs ignored, is either
//
//   - an RFC 8941 sf-string, as the IETF httpapi draft defines the field:
//     a double-quoted string of printable ASCII in which only \" and \\
//     are escapes (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`), with no
//     parameters; or
//   - a bare key, as Stripe-style clients send it: visible ASCII without
//     spaces, double quotes, commas, semicolons or backslashes, which would
//     make the value ambiguous with a structured field.
//
// After unquoting the key must be 1 to 255 printable ASCII characters
// ([durable.ValidateKey]). Errors: [ErrKeyMissing], [ErrKeyInvalid]; neither
// quotes the value.
func ParseKey(h http.Header, name string) (string, error) {
	if name == "" {
		name = Header
	}
	vals := h.Values(name)
	switch len(vals) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", fmt.Errorf("%w: sent on %d field lines, want exactly one", ErrKeyInvalid, len(vals))
	}
	return parseKeyValue(vals[0])
}

// parseKeyValue parses one field value.
func parseKeyValue(v string) (string, error) {
	v = strings.Trim(v, " \t")
	var key string
	if strings.HasPrefix(v, `"`) {
		s, rest, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		if rest != "" {
			return "", fmt.Errorf("%w: unexpected characters after the string (parameters are not accepted)", ErrKeyInvalid)
		}
		key = s
	} else {
		for i := 0; i < len(v); i++ {
			if !bareChar(v[i]) {
				return "", fmt.Errorf("%w: bare key with a character outside visible ASCII or one of space, '\"', ',', ';', '\\'", ErrKeyInvalid)
			}
		}
		key = v
	}
	if err := durable.ValidateKey(key); err != nil {
		return "", fmt.Errorf("%w: %w", ErrKeyInvalid, err)
	}
	return key, nil
}

// bareChar reports whether c may appear in a bare (unquoted) key.
func bareChar(c byte) bool {
	if c <= 0x20 || c >= 0x7f {
		return false
	}
	switch c {
	case '"', ',', ';', '\\':
		return false
	}
	return true
}

// parseSFString parses an RFC 8941 sf-string at the start of v (which
// begins with a double quote), following section 4.2.5 of the RFC, and
// returns its value and the input after the closing quote.
func parseSFString(v string) (string, string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) {
				return "", "", fmt.Errorf("%w: string ends inside an escape", ErrKeyInvalid)
			}
			if d := v[i]; d == '"' || d == '\\' {
				b.WriteByte(d)
				continue
			}
			return "", "", fmt.Errorf("%w: only \\\" and \\\\ are escapes in a string", ErrKeyInvalid)
		case c == '"':
			return b.String(), v[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", fmt.Errorf("%w: string holds a character outside printable ASCII", ErrKeyInvalid)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("%w: unterminated string", ErrKeyInvalid)
}

// FormatKey returns key as an RFC 8941 sf-string, the form the httpapi
// draft defines and the client transport sends: double-quoted, with '"' and '\'
// escaped. Errors: [ErrKeyInvalid] for a key that fails
// [durable.ValidateKey].
func FormatKey(key string) (string, error) {
	if err := durable.ValidateKey(key); err != nil {
		return "", fmt.Errorf("%w: %w", ErrKeyInvalid, err)
	}
	var b strings.Builder
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String(), nil
}
