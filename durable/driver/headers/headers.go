// Package headers is the stored form of response headers shared by the SQL
// backends of package durable: a deterministic, byte-for-byte encoding.
//
// Header field values may hold any byte but CR, LF and NUL (RFC 9110 allows
// obs-text, 0x80 to 0xFF, in an ETag for one). encoding/json would turn such
// bytes into U+FFFD, so a stored result would no longer equal the one written
// and a repeated Complete with the same result would look like another
// write. This encoding keeps every byte.
//
// The format, version 1:
//
//	encoding = "h1" *field
//	field    = len ":" name count ":" *value   ; fields sorted by name, bytewise, names unique
//	value    = len ":" bytes
//	len, count = decimal digits, no leading zero ("0" for zero)
//
// Lengths count bytes. Equal maps encode to equal bytes (a nil and an empty
// value list alike), so stored headers can be compared by their encoding.
// The format is plain enough for SQL to produce from the former JSON column:
// migration 002 of each backend converts existing rows that way.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package headers

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// magic starts every encoding; a later format changes it.
const magic = "h1"

// ErrCorrupt is returned by Decode for bytes that are not an encoding.
var ErrCorrupt = errors.New("headers: corrupt encoding")

// Encode returns the encoding of h, or nil when h has no field (stored as
// NULL).
func Encode(h map[string][]string) []byte {
	if len(h) == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	n := len(magic)
	for name, vs := range h {
		names = append(names, name)
		n += len(name) + 24
		for _, v := range vs {
			n += len(v) + 12
		}
	}
	slices.Sort(names) // bytewise, as SQL sorts bytea and BLOB
	b := make([]byte, 0, n)
	b = append(b, magic...)
	for _, name := range names {
		vs := h[name]
		b = strconv.AppendInt(b, int64(len(name)), 10)
		b = append(b, ':')
		b = append(b, name...)
		b = strconv.AppendInt(b, int64(len(vs)), 10)
		b = append(b, ':')
		for _, v := range vs {
			b = strconv.AppendInt(b, int64(len(v)), 10)
			b = append(b, ':')
			b = append(b, v...)
		}
	}
	return b
}

// Decode returns the headers b encodes; nil for nil or empty b. A field
// with no value decodes to an empty, non-nil list. It returns an error
// matching [ErrCorrupt] for anything Encode cannot have produced.
func Decode(b []byte) (map[string][]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: unknown format", ErrCorrupt)
	}
	d := decoder{b: b, i: len(magic)}
	h := map[string][]string{}
	prev := ""
	for d.i < len(d.b) {
		name, err := d.bytes()
		if err != nil {
			return nil, err
		}
		if len(h) > 0 && string(name) <= prev {
			return nil, fmt.Errorf("%w: field names out of order", ErrCorrupt)
		}
		count, err := d.number()
		if err != nil {
			return nil, err
		}
		if count > len(d.b)-d.i { // each value takes at least 2 bytes ("0:")
			return nil, fmt.Errorf("%w: value count out of range", ErrCorrupt)
		}
		vs := make([]string, 0, count)
		for range count {
			v, err := d.bytes()
			if err != nil {
				return nil, err
			}
			vs = append(vs, string(v))
		}
		prev = string(name)
		h[prev] = vs
	}
	return h, nil
}

type decoder struct {
	b []byte
	i int
}

// number reads a canonical decimal followed by ':'.
func (d *decoder) number() (int, error) {
	start := d.i
	n := 0
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		if d.i-start >= 10 {
			return 0, fmt.Errorf("%w: length out of range", ErrCorrupt)
		}
		n = n*10 + int(d.b[d.i]-'0')
		d.i++
	}
	switch {
	case d.i == start, d.i >= len(d.b), d.b[d.i] != ':':
		return 0, fmt.Errorf("%w: expected a length", ErrCorrupt)
	case d.b[start] == '0' && d.i-start > 1:
		return 0, fmt.Errorf("%w: length with a leading zero", ErrCorrupt)
	}
	d.i++ // ':'
	return n, nil
}

// bytes reads len ":" bytes.
func (d *decoder) bytes() ([]byte, error) {
	n, err := d.number()
	if err != nil {
		return nil, err
	}
	if n > len(d.b)-d.i {
		return nil, fmt.Errorf("%w: truncated", ErrCorrupt)
	}
	v := d.b[d.i : d.i+n]
	d.i += n
	return v, nil
}
