package canon

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// maxDepth is the deepest nesting of arrays and objects that [JSON] accepts.
// The top-level array or object is depth 1.
const maxDepth = 1000

// JSON returns the RFC 8785 (JSON Canonicalization Scheme) form of the JSON
// text src:
//
//   - object members sorted by the UTF-16 code units of their names, with no
//     insignificant whitespace;
//   - strings with only '"', '\' and U+0000..U+001F escaped, using \b \f \n
//     \r \t where they exist and \u00xx (lowercase hex) otherwise; all other
//     characters, escaped in the input or not, written as literal UTF-8;
//   - numbers parsed as IEEE-754 doubles and written as ECMAScript's
//     Number.prototype.toString does (shortest round-trip digits, exponent
//     form for magnitudes >= 1e21 or < 1e-6, -0 as 0).
//
// Integers beyond 2^53 are rounded to the nearest double, exactly as the RFC
// says; fingerprinting uses [JSONStrict] instead, which rejects them.
//
// Input that is not JSON, or that RFC 8785 forbids (invalid UTF-8, a lone
// surrogate escape, a duplicate member name, a number beyond a double's
// range), and nesting deeper than 1000 levels fail with an error matching
// [ErrInvalid] whose message gives the byte offset. src is not retained or
// modified; the result is a new slice.
func JSON(src []byte) ([]byte, error) {
	return canonicalJSON(nil, src, false, nil)
}

// JSONStrict is [JSON] with the fingerprinting precision rule: a plain
// integer literal (no fraction, no exponent) whose double does not print as
// the same integer, such as 9007199254740993 or 1000000000000000000000,
// fails with an error matching [ErrInvalid]. So two different integers can
// never share a canonical form. Use it, then [Sum], to
// fingerprint JSON that does not arrive in an *http.Request; [Request] uses
// it for JSON bodies.
func JSONStrict(src []byte) ([]byte, error) {
	return canonicalJSON(nil, src, true, nil)
}

// canonicalJSON appends the canonical form of src to dst. With strict, an
// imprecise integer literal is an error; members at the pointers in exclude
// are left out.
func canonicalJSON(dst, src []byte, strict bool, exclude []pointer) ([]byte, error) {
	p := parserPool.Get().(*parser)
	defer p.release()
	p.src = src
	root, err := p.parse()
	if err != nil {
		return dst, err
	}
	for _, ptr := range exclude {
		p.exclude(root, ptr)
	}
	if dst == nil {
		dst = make([]byte, 0, len(src)+16)
	}
	p.strict = strict
	return p.write(dst, &root)
}

// Value kinds. Scalars carry their text; containers a range of p.kids.
const (
	kindLit    uint8 = iota // literal or number: text is its canonical form
	kindStr                 // string whose decoded text needs no escaping
	kindStrEsc              // string whose decoded text needs escaping
	kindBigInt              // integer literal of more than 15 digits: text is the literal
	kindArr
	kindObj
)

// Flags of a text span.
const (
	inArena   uint8 = 1 << iota // the text is in p.arena, not in p.src
	imprecise                   // kindBigInt: the double prints differently
)

// value is one parsed JSON value. Parsing builds a tree of values and a
// second pass writes it, so every output byte is written once: canonicalizing
// an object in place would move each subtree once per enclosing object that
// needs sorting, O(size x depth), which hostile input can make large.
//
// value and member hold offsets, not slices: without pointers they are small
// and sorting members moves plain memory, with no GC write barriers.
type value struct {
	// off is the offset of the text in p.src or p.arena (scalars), or the
	// index in p.kids of the first child (containers).
	off int
	// n is the length of the text (scalars) or the number of children
	// (containers).
	n     int32
	kind  uint8
	flags uint8
}

// member is an object member or an array element (key unused).
type member struct {
	keyOff   int
	keyLen   int32
	keyFlags uint8 // inArena
	keyEsc   bool  // the decoded name needs escaping
	skip     bool  // excluded by a pointer
	val      value
}

type parser struct {
	src    []byte
	pos    int
	depth  int
	strict bool
	arena  []byte   // decoded strings and reformatted numbers
	stack  []member // children of the containers being parsed
	kids   []member // children of finished containers, contiguous per container
}

var parserPool = sync.Pool{New: func() any { return new(parser) }}

// release returns p to the pool, dropping its reference to the caller's
// input; very large buffers are not kept.
func (p *parser) release() {
	*p = parser{arena: p.arena[:0], stack: p.stack[:0], kids: p.kids[:0]}
	if cap(p.arena) > 1<<22 || cap(p.kids) > 1<<17 || cap(p.stack) > 1<<17 {
		return
	}
	parserPool.Put(p)
}

// text returns the bytes of a span.
func (p *parser) text(off int, n int32, flags uint8) []byte {
	if flags&inArena != 0 {
		return p.arena[off : off+int(n)]
	}
	return p.src[off : off+int(n)]
}

func (p *parser) key(m *member) []byte { return p.text(m.keyOff, m.keyLen, m.keyFlags) }

func (p *parser) parse() (value, error) {
	v, err := p.value()
	if err != nil {
		return v, err
	}
	p.skipSpace()
	if p.pos < len(p.src) {
		return v, syntaxErr(p.pos, errSyntax, "unexpected data after the top-level value")
	}
	return v, nil
}

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value() (value, error) {
	p.skipSpace()
	if p.pos >= len(p.src) {
		return value{}, syntaxErr(p.pos, errSyntax, "unexpected end of input")
	}
	switch c := p.src[p.pos]; c {
	case '{':
		return p.object()
	case '[':
		return p.array()
	case '"':
		off, n, flags, esc, err := p.string()
		if err != nil {
			return value{}, err
		}
		k := kindStr
		if esc {
			k = kindStrEsc
		}
		return value{off: off, n: n, kind: k, flags: flags}, nil
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return p.number()
		}
		if c >= utf8.RuneSelf {
			return value{}, syntaxErr(p.pos, errSyntax, "unexpected non-ASCII byte")
		}
		return value{}, syntaxErr(p.pos, errSyntax, "unexpected character")
	}
}

func (p *parser) literal(lit string) (value, error) {
	end := p.pos + len(lit)
	if end > len(p.src) || string(p.src[p.pos:end]) != lit {
		return value{}, syntaxErr(p.pos, errSyntax, "invalid literal")
	}
	v := value{off: p.pos, n: int32(len(lit)), kind: kindLit}
	p.pos = end
	return v, nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxDepth {
		return syntaxErr(p.pos, errTooDeep, "more than "+strconv.Itoa(maxDepth)+" levels")
	}
	return nil
}

func (p *parser) array() (value, error) {
	if err := p.enter(); err != nil {
		return value{}, err
	}
	p.pos++ // '['
	base := len(p.stack)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
	} else {
		for {
			v, err := p.value()
			if err != nil {
				return value{}, err
			}
			p.stack = append(p.stack, member{val: v})
			p.skipSpace()
			if p.pos >= len(p.src) {
				return value{}, syntaxErr(p.pos, errSyntax, "unexpected end of input in array")
			}
			c := p.src[p.pos]
			p.pos++
			if c == ']' {
				break
			}
			if c != ',' {
				return value{}, syntaxErr(p.pos-1, errSyntax, "expected ',' or ']'")
			}
		}
	}
	p.depth--
	return p.finish(kindArr, base), nil
}

// finish moves the children collected since base into p.kids.
func (p *parser) finish(kind uint8, base int) value {
	first := len(p.kids)
	p.kids = append(p.kids, p.stack[base:]...)
	n := len(p.stack) - base
	p.stack = p.stack[:base]
	return value{kind: kind, off: first, n: int32(n)}
}

func (p *parser) object() (value, error) {
	start := p.pos
	if err := p.enter(); err != nil {
		return value{}, err
	}
	p.pos++ // '{'
	base := len(p.stack)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
	} else {
		for {
			p.skipSpace()
			if p.pos >= len(p.src) || p.src[p.pos] != '"' {
				return value{}, syntaxErr(p.pos, errSyntax, "expected a member name")
			}
			off, n, flags, esc, err := p.string()
			if err != nil {
				return value{}, err
			}
			p.skipSpace()
			if p.pos >= len(p.src) || p.src[p.pos] != ':' {
				return value{}, syntaxErr(p.pos, errSyntax, "expected ':'")
			}
			p.pos++
			v, err := p.value()
			if err != nil {
				return value{}, err
			}
			p.stack = append(p.stack, member{keyOff: off, keyLen: n, keyFlags: flags, keyEsc: esc, val: v})
			p.skipSpace()
			if p.pos >= len(p.src) {
				return value{}, syntaxErr(p.pos, errSyntax, "unexpected end of input in object")
			}
			c := p.src[p.pos]
			p.pos++
			if c == '}' {
				break
			}
			if c != ',' {
				return value{}, syntaxErr(p.pos-1, errSyntax, "expected ',' or '}'")
			}
		}
	}
	p.depth--
	v := p.finish(kindObj, base)
	ms := p.kids[v.off : v.off+int(v.n)]
	cmpMembers := func(a, b member) int { return compareKeys(p.key(&a), p.key(&b)) }
	sorted := true
	for i := 1; i < len(ms); i++ {
		if cmpMembers(ms[i-1], ms[i]) > 0 {
			sorted = false
			break
		}
	}
	if !sorted {
		slices.SortFunc(ms, cmpMembers)
	}
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(p.key(&ms[i-1]), p.key(&ms[i])) {
			return value{}, syntaxErr(start, errDuplicate, "in the object starting here")
		}
	}
	return v, nil
}

// compareKeys orders two well-formed UTF-8 names by their UTF-16 code units,
// as RFC 8785 section 3.2.3 requires.
//
// UTF-8 byte order is code point order, and so is UTF-16 order except in
// one place: characters U+E000..U+FFFF (lead bytes 0xEE, 0xEF) sort after
// the supplementary planes in UTF-16, whose surrogates are 0xD800..0xDFFF,
// but before them in UTF-8 (lead bytes 0xF0..0xF4). So at the first
// differing byte, byte order is right unless those two classes meet. (On
// arbitrary bytes this is still a total order: byte-wise comparison under
// the alphabet 0x00..0xED < 0xF0..0xFF < 0xEE < 0xEF.)
func compareKeys(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	x, y := a[i], b[i]
	// Both >= 0xEE means both are lead bytes (continuation bytes are at most
	// 0xBF), and the runes start here.
	if x >= 0xEE && y >= 0xEE && (x >= 0xF0) != (y >= 0xF0) {
		if x >= 0xF0 {
			return -1
		}
		return 1
	}
	return int(x) - int(y)
}

// strSafe marks the ASCII bytes that a string holds as they are: printable
// characters other than '"' and '\'.
var strSafe = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// string parses the string at p.pos (its opening quote) and returns the span
// of its decoded text, which is in the input when it has no escapes, and
// whether the text needs escaping on output.
func (p *parser) string() (off int, n int32, flags uint8, esc bool, err error) {
	src := p.src
	start := p.pos + 1
	i := start
	for i < len(src) {
		c := src[i]
		if c < utf8.RuneSelf {
			if strSafe[c] {
				i++
				continue
			}
			switch c {
			case '"':
				p.pos = i + 1
				return start, int32(i - start), 0, false, nil
			case '\\':
				return p.stringSlow(start, i)
			default:
				return 0, 0, 0, false, syntaxErr(i, errSyntax, "control character in string")
			}
		}
		r, size := utf8.DecodeRune(src[i:])
		if r == utf8.RuneError && size == 1 {
			return 0, 0, 0, false, syntaxErr(i, errUTF8, "")
		}
		i += size
	}
	return 0, 0, 0, false, syntaxErr(p.pos, errSyntax, "unterminated string")
}

// stringSlow decodes a string with escapes into the arena; src[start:i] is
// the part already scanned and src[i] is a backslash.
func (p *parser) stringSlow(start, i int) (off int, n int32, flags uint8, esc bool, err error) {
	src := p.src
	a0 := len(p.arena)
	p.arena = append(p.arena, src[start:i]...)
	for i < len(src) {
		c := src[i]
		if c < utf8.RuneSelf {
			if strSafe[c] {
				p.arena = append(p.arena, c)
				i++
				continue
			}
			switch c {
			case '"':
				p.pos = i + 1
				return a0, int32(len(p.arena) - a0), inArena, esc, nil
			case '\\':
			default:
				return 0, 0, 0, false, syntaxErr(i, errSyntax, "control character in string")
			}
			if i+1 >= len(src) {
				return 0, 0, 0, false, syntaxErr(i, errSyntax, "unterminated string")
			}
			var d byte
			switch src[i+1] {
			case '"', '\\':
				d, esc = src[i+1], true
			case '/':
				d = '/'
			case 'b':
				d, esc = '\b', true
			case 'f':
				d, esc = '\f', true
			case 'n':
				d, esc = '\n', true
			case 'r':
				d, esc = '\r', true
			case 't':
				d, esc = '\t', true
			case 'u':
				r, next, err := p.unicodeEscape(i)
				if err != nil {
					return 0, 0, 0, false, err
				}
				if r < 0x20 || r == '"' || r == '\\' {
					esc = true
				}
				p.arena = utf8.AppendRune(p.arena, r)
				i = next
				continue
			default:
				return 0, 0, 0, false, syntaxErr(i, errSyntax, "invalid escape")
			}
			p.arena = append(p.arena, d)
			i += 2
			continue
		}
		r, size := utf8.DecodeRune(src[i:])
		if r == utf8.RuneError && size == 1 {
			return 0, 0, 0, false, syntaxErr(i, errUTF8, "")
		}
		p.arena = append(p.arena, src[i:i+size]...)
		i += size
	}
	return 0, 0, 0, false, syntaxErr(p.pos, errSyntax, "unterminated string")
}

// unicodeEscape decodes the \uXXXX escape at src[i], and the low half that
// must follow a high surrogate, returning the rune and the index after it.
func (p *parser) unicodeEscape(i int) (rune, int, error) {
	r, ok := hex4(p.src, i+2)
	if !ok {
		return 0, 0, syntaxErr(i, errSyntax, "invalid \\u escape")
	}
	switch {
	case r < 0xD800 || r > 0xDFFF:
		return r, i + 6, nil
	case r >= 0xDC00:
		return 0, 0, syntaxErr(i, errSurrogate, "low surrogate without a high one")
	}
	j := i + 6
	if j+1 >= len(p.src) || p.src[j] != '\\' || p.src[j+1] != 'u' {
		return 0, 0, syntaxErr(i, errSurrogate, "high surrogate without a low one")
	}
	lo, ok := hex4(p.src, j+2)
	if !ok {
		return 0, 0, syntaxErr(j, errSyntax, "invalid \\u escape")
	}
	if lo < 0xDC00 || lo > 0xDFFF {
		return 0, 0, syntaxErr(i, errSurrogate, "high surrogate without a low one")
	}
	return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), j + 6, nil
}

func hex4(src []byte, i int) (rune, bool) {
	if i+4 > len(src) {
		return 0, false
	}
	var r rune
	for _, c := range src[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number parses the RFC 8259 number at p.pos and returns its canonical text.
func (p *parser) number() (value, error) {
	src := p.src
	start := p.pos
	i := start
	if src[i] == '-' {
		i++
	}
	intStart := i
	switch {
	case i < len(src) && src[i] == '0':
		i++
	case i < len(src) && src[i] >= '1' && src[i] <= '9':
		for i < len(src) && src[i] >= '0' && src[i] <= '9' {
			i++
		}
	default:
		return value{}, syntaxErr(start, errSyntax, "invalid number")
	}
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(src) && src[i] == '.' {
		i++
		fracStart = i
		for i < len(src) && src[i] >= '0' && src[i] <= '9' {
			i++
		}
		if i == fracStart {
			return value{}, syntaxErr(start, errSyntax, "invalid number")
		}
		fracEnd = i
	}
	hasExp := false
	if i < len(src) && (src[i] == 'e' || src[i] == 'E') {
		hasExp = true
		i++
		if i < len(src) && (src[i] == '+' || src[i] == '-') {
			i++
		}
		d := i
		for i < len(src) && src[i] >= '0' && src[i] <= '9' {
			i++
		}
		if i == d {
			return value{}, syntaxErr(start, errSyntax, "invalid number")
		}
	}
	p.pos = i
	lit := value{off: start, n: int32(i - start), kind: kindLit}
	isInt := fracStart == fracEnd && !hasExp

	// Fast paths: literals that are already canonical. A decimal with at most
	// 15 significant digits round-trips through a double (DBL_DIG is 15), so
	// its shortest round-trip digits are its own; it is canonical when it
	// has no exponent, no trailing fraction zero, and a magnitude in
	// [1e-6, 1e21).
	if isInt {
		if intEnd-intStart <= 15 {
			if i-start == 2 && src[start] == '-' && src[start+1] == '0' {
				lit.off, lit.n = start+1, 1 // -0 is 0
			}
			return lit, nil
		}
	} else if !hasExp && src[fracEnd-1] != '0' {
		sig := (intEnd - intStart) + (fracEnd - fracStart)
		fast := true
		if src[intStart] == '0' { // 0.xxx: leading fraction zeros are not significant
			z := fracStart
			for src[z] == '0' {
				z++
			}
			fast = z-fracStart <= 5 // at least 1e-6
			sig = fracEnd - z
		}
		if fast && sig <= 15 {
			return lit, nil
		}
	}

	f, err := parseFloat(src[start:i])
	if err != nil {
		return value{}, err.(*syntaxError).at(start)
	}
	a0 := len(p.arena)
	p.arena = appendNumber(p.arena, f)
	text := p.arena[a0:]
	if isInt {
		// Keep the literal's span: the writer reformats it, or rejects it
		// under the precision rule.
		lit.kind = kindBigInt
		if !bytes.Equal(text, src[start:i]) {
			lit.flags = imprecise
		}
		p.arena = p.arena[:a0]
		return lit, nil
	}
	return value{off: a0, n: int32(len(text)), kind: kindLit, flags: inArena}, nil
}

// parseFloat parses a literal that matched the JSON number grammar.
func parseFloat(lit []byte) (float64, error) {
	// unsafe.String avoids copying the literal: ParseFloat keeps the string
	// only in its error, which is dropped here.
	f, err := strconv.ParseFloat(unsafe.String(&lit[0], len(lit)), 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) && math.IsInf(f, 0) {
			return 0, &syntaxError{kind: errOverflow}
		}
		return 0, &syntaxError{kind: errSyntax, Detail: "invalid number"}
	}
	return f, nil
}

// write appends the canonical text of v.
func (p *parser) write(dst []byte, v *value) ([]byte, error) {
	switch v.kind {
	case kindLit:
		return append(dst, p.text(v.off, v.n, v.flags)...), nil
	case kindStr:
		dst = append(dst, '"')
		dst = append(dst, p.text(v.off, v.n, v.flags)...)
		return append(dst, '"'), nil
	case kindStrEsc:
		return appendEscaped(dst, p.text(v.off, v.n, v.flags)), nil
	case kindBigInt:
		lit := p.src[v.off : v.off+int(v.n)]
		if v.flags&imprecise == 0 {
			return append(dst, lit...), nil
		}
		if p.strict {
			return dst, syntaxErr(v.off, errPrecision, "send integers beyond 2^53 as strings")
		}
		f, err := parseFloat(lit) // succeeded once already
		if err != nil {
			return dst, err.(*syntaxError).at(v.off)
		}
		return appendNumber(dst, f), nil
	case kindArr:
		dst = append(dst, '[')
		var err error
		for i := v.off; i < v.off+int(v.n); i++ {
			if i > v.off {
				dst = append(dst, ',')
			}
			if dst, err = p.write(dst, &p.kids[i].val); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	default: // kindObj
		dst = append(dst, '{')
		var err error
		comma := false
		for i := v.off; i < v.off+int(v.n); i++ {
			m := &p.kids[i]
			if m.skip {
				continue
			}
			if comma {
				dst = append(dst, ',')
			}
			comma = true
			if m.keyEsc {
				dst = appendEscaped(dst, p.key(m))
			} else {
				dst = append(dst, '"')
				dst = append(dst, p.key(m)...)
				dst = append(dst, '"')
			}
			dst = append(dst, ':')
			if dst, err = p.write(dst, &m.val); err != nil {
				return dst, err
			}
		}
		return append(dst, '}'), nil
	}
}

func appendEscaped(dst, s []byte) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	last := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[last:i]...)
		last = i + 1
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
	}
	dst = append(dst, s[last:]...)
	return append(dst, '"')
}
