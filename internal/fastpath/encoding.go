package fastpath

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/oncekey/oncekey/durable"
)

// resultV1 is the first byte of a version 1 encoded result.
const resultV1 = 0x01

// encodeResult returns the canonical version 1 encoding of a finished
// result, stored in the "d" field of the result hash:
//
//	0x01                          version
//	str   state                   "completed" or "failed"
//	varint StatusCode
//	varint Version
//	str   ResourceID
//	uvarint headers: 0 = nil map, n+1 = n names, then per name, in
//	        strictly ascending byte order:
//	        str name, uvarint values (0 = nil slice, n+1 = n values), str value...
//	uvarint body: 0 = nil, n+1 = n bytes, then the bytes
//
// where str is a uvarint length followed by the bytes. Everything is binary
// safe; nil and empty maps, slices and bodies are told apart, so a result
// round-trips exactly. The same result always encodes to the same bytes,
// which complete.lua relies on to make a re-run a no-op.
func encodeResult(state durable.State, r durable.Result) []byte {
	return []byte(encodeResultString(state, r))
}

// encodeResultString is [encodeResult] as a string, built in one
// allocation: it is sent to Redis as it is, without a copy.
func encodeResultString(state durable.State, r durable.Result) string {
	n := 1 + 3*binary.MaxVarintLen64 + len(state) + len(r.ResourceID) + len(r.Body) + 2*binary.MaxVarintLen64
	for k, vs := range r.Headers {
		n += len(k) + 2*binary.MaxVarintLen64
		for _, v := range vs {
			n += len(v) + binary.MaxVarintLen64
		}
	}
	var e encoder
	e.b.Grow(n)
	e.b.WriteByte(resultV1)
	e.str(string(state))
	e.varint(int64(r.StatusCode))
	e.varint(int64(r.Version))
	e.str(r.ResourceID)
	if r.Headers == nil {
		e.uvarint(0)
	} else {
		// The names, sorted, in a stack array when they are few.
		var arr [8]string
		names := arr[:0]
		for k := range r.Headers {
			names = append(names, k)
		}
		slices.Sort(names)
		e.uvarint(uint64(len(names)) + 1)
		for _, k := range names {
			e.str(k)
			vs := r.Headers[k]
			if vs == nil {
				e.uvarint(0)
				continue
			}
			e.uvarint(uint64(len(vs)) + 1)
			for _, v := range vs {
				e.str(v)
			}
		}
	}
	if r.Body == nil {
		e.uvarint(0)
	} else {
		e.uvarint(uint64(len(r.Body)) + 1)
		e.b.Write(r.Body)
	}
	return e.b.String()
}

// encoder writes an encoded result.
type encoder struct{ b strings.Builder }

func (e *encoder) uvarint(v uint64) {
	var tmp [binary.MaxVarintLen64]byte
	e.b.Write(binary.AppendUvarint(tmp[:0], v))
}

func (e *encoder) varint(v int64) {
	var tmp [binary.MaxVarintLen64]byte
	e.b.Write(binary.AppendVarint(tmp[:0], v))
}

func (e *encoder) str(s string) {
	e.uvarint(uint64(len(s)))
	e.b.WriteString(s)
}

// decoder reads an encoded result; the first error sticks.
type decoder struct {
	b   string
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: result encoding: %s", ErrCorrupt, what)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := uvarint(d.b)
	if n <= 0 || (n > 1 && d.b[n-1] == 0) { // overlong: not canonical
		d.fail("bad " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// varint reads what binary.AppendVarint wrote: a zigzag-encoded uvarint.
func (d *decoder) varint(what string) int64 {
	ux := d.uvarint(what)
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

// bytes returns the next n bytes, sharing the input's memory.
func (d *decoder) bytes(n uint64, what string) string {
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail(what + " runs past the end")
		return ""
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(what string) string {
	return d.bytes(d.uvarint(what+" length"), what)
}

// uvarint is binary.Uvarint of a string.
func uvarint(s string) (uint64, int) {
	var x uint64
	var sh uint
	for i := 0; i < len(s); i++ {
		if i == binary.MaxVarintLen64 {
			return 0, -(i + 1) // overflow
		}
		b := s[i]
		if b < 0x80 {
			if i == binary.MaxVarintLen64-1 && b > 1 {
				return 0, -(i + 1) // overflow
			}
			return x | uint64(b)<<sh, i + 1
		}
		x |= uint64(b&0x7f) << sh
		sh += 7
	}
	return 0, 0
}

// count reads a "0 = nil, n+1 = n" count; each counted item takes at least
// one byte, which bounds the allocation by the input's length.
func (d *decoder) count(what string) (n int, isNil bool) {
	v := d.uvarint(what)
	if d.err != nil || v == 0 {
		return 0, true
	}
	if v-1 > uint64(len(d.b)) {
		d.fail(what + " larger than the input")
		return 0, true
	}
	return int(v - 1), false
}

// decodeResult reads what encodeResult wrote. It accepts only the canonical
// encoding (known version, valid finished state, ascending unique header
// names, no trailing bytes) and returns an error matching [ErrCorrupt]
// otherwise. Decoding a string copies nothing but the body: the other
// strings of the result share b's memory.
func decodeResult[T string | []byte](b T) (durable.State, durable.Result, error) {
	if len(b) == 0 || b[0] != resultV1 {
		return "", durable.Result{}, fmt.Errorf("%w: result encoding: unknown version", ErrCorrupt)
	}
	d := &decoder{b: string(b)[1:]}
	var r durable.Result
	state := finishedState(d.str("state"))
	status := d.varint("status")
	version := d.varint("version")
	r.StatusCode, r.Version = int(status), int(version)
	if int64(r.StatusCode) != status || int64(r.Version) != version {
		d.fail("integer out of range")
	}
	r.ResourceID = d.str("resource id")
	if n, isNil := d.count("header count"); !isNil {
		r.Headers = make(map[string][]string, n)
		prev := ""
		for i := 0; i < n && d.err == nil; i++ {
			k := d.str("header name")
			if i > 0 && k <= prev {
				d.fail("header names not ascending")
			}
			prev = k
			m, vnil := d.count("header value count")
			if vnil {
				r.Headers[k] = nil
				continue
			}
			vs := make([]string, m)
			for j := range vs {
				vs[j] = d.str("header value")
			}
			r.Headers[k] = vs
		}
	}
	if n, isNil := d.count("body length"); !isNil {
		r.Body = []byte(d.bytes(uint64(n), "body"))
		if r.Body == nil {
			r.Body = []byte{}
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err == nil && !state.Finished() {
		d.fail("state " + string(state) + " is not completed or failed")
	}
	if d.err != nil {
		return "", durable.Result{}, d.err
	}
	return state, r, nil
}

// finishedState returns s as a State, the constant itself for a finished
// one, so a decoded result does not keep the reply's memory for it.
func finishedState(s string) durable.State {
	switch durable.State(s) {
	case durable.Completed:
		return durable.Completed
	case durable.Failed:
		return durable.Failed
	}
	return durable.State(s)
}
