package fastpath

import (
	"encoding/binary"
	"fmt"
	"slices"

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
	n := 1 + 3*binary.MaxVarintLen64 + len(state) + len(r.ResourceID) + len(r.Body) + 2*binary.MaxVarintLen64
	for k, vs := range r.Headers {
		n += len(k) + 2*binary.MaxVarintLen64
		for _, v := range vs {
			n += len(v) + binary.MaxVarintLen64
		}
	}
	b := make([]byte, 0, n)
	b = append(b, resultV1)
	b = appendStr(b, string(state))
	b = binary.AppendVarint(b, int64(r.StatusCode))
	b = binary.AppendVarint(b, int64(r.Version))
	b = appendStr(b, r.ResourceID)
	if r.Headers == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		names := make([]string, 0, len(r.Headers))
		for k := range r.Headers {
			names = append(names, k)
		}
		slices.Sort(names)
		b = binary.AppendUvarint(b, uint64(len(names))+1)
		for _, k := range names {
			b = appendStr(b, k)
			vs := r.Headers[k]
			if vs == nil {
				b = binary.AppendUvarint(b, 0)
				continue
			}
			b = binary.AppendUvarint(b, uint64(len(vs))+1)
			for _, v := range vs {
				b = appendStr(b, v)
			}
		}
	}
	if r.Body == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(r.Body))+1)
		b = append(b, r.Body...)
	}
	return b
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads an encoded result; the first error sticks.
type decoder struct {
	b   []byte
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
	v, n := binary.Uvarint(d.b)
	if n <= 0 || (n > 1 && d.b[n-1] == 0) { // overlong: not canonical
		d.fail("bad " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 || (n > 1 && d.b[n-1] == 0) { // overlong: not canonical
		d.fail("bad " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n uint64, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(what + " runs past the end")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(what string) string {
	return string(d.bytes(d.uvarint(what+" length"), what))
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
// otherwise. The returned Body shares b's memory (with its capacity cut to
// its length).
func decodeResult(b []byte) (durable.State, durable.Result, error) {
	if len(b) == 0 || b[0] != resultV1 {
		return "", durable.Result{}, fmt.Errorf("%w: result encoding: unknown version", ErrCorrupt)
	}
	d := &decoder{b: b[1:]}
	var r durable.Result
	state := durable.State(d.str("state"))
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
		r.Body = d.bytes(uint64(n), "body")
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
