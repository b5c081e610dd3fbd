package canon

import (
	"fmt"
	"strings"
)

// pointer is a parsed RFC 6901 JSON Pointer: its reference tokens, unescaped.
type pointer [][]byte

// parsePointer parses an RFC 6901 JSON Pointer that names an object member:
// it must be non-empty ("" would name the whole document), start with '/',
// and use '~' only in the escapes "~0" ('~') and "~1" ('/').
func parsePointer(s string) (pointer, error) {
	if s == "" || s[0] != '/' {
		return nil, fmt.Errorf("%w: exclude %q: a JSON Pointer starts with '/'", ErrConfig, s)
	}
	parts := strings.Split(s[1:], "/")
	ptr := make(pointer, len(parts))
	for i, part := range parts {
		var tok []byte
		for j := 0; j < len(part); j++ {
			c := part[j]
			if c == '~' {
				if j+1 >= len(part) || (part[j+1] != '0' && part[j+1] != '1') {
					return nil, fmt.Errorf("%w: exclude %q: '~' must be followed by '0' or '1'", ErrConfig, s)
				}
				if part[j+1] == '0' {
					c = '~'
				} else {
					c = '/'
				}
				j++
			}
			tok = append(tok, c)
		}
		ptr[i] = tok
	}
	return ptr, nil
}

// exclude marks the member at ptr as skipped. A pointer that does not
// resolve, or that names an array element rather than an object member,
// excludes nothing. Array elements are addressed by index on the way
// ("/items/0/note"), as RFC 6901 says; "-" and indexes with leading zeros
// match nothing.
func (p *parser) exclude(root value, ptr pointer) {
	cur := root
	for i, tok := range ptr {
		switch cur.kind {
		case kindObj:
			ms := p.kids[cur.off : cur.off+int(cur.n)]
			// Members are sorted by compareKeys and unique.
			lo, hi := 0, len(ms)
			for lo < hi {
				mid := int(uint(lo+hi) >> 1)
				if compareKeys(p.key(&ms[mid]), tok) < 0 {
					lo = mid + 1
				} else {
					hi = mid
				}
			}
			if lo == len(ms) || compareKeys(p.key(&ms[lo]), tok) != 0 {
				return
			}
			if i == len(ptr)-1 {
				ms[lo].skip = true
				return
			}
			cur = ms[lo].val
		case kindArr:
			idx, ok := arrayIndex(tok)
			if !ok || idx >= int(cur.n) || i == len(ptr)-1 {
				return
			}
			cur = p.kids[cur.off+idx].val
		default:
			return
		}
	}
}

// arrayIndex parses an RFC 6901 array index: "0" or a decimal without
// leading zeros.
func arrayIndex(tok []byte) (int, bool) {
	if len(tok) == 0 || len(tok) > 9 || (tok[0] == '0' && len(tok) > 1) {
		return 0, false
	}
	n := 0
	for _, c := range tok {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}
