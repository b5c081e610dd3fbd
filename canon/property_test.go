package canon_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/gowebpki/jcs"
	"github.com/oncekey/oncekey/canon"
)

// A generated JSON value: nil, bool, float64, string, []*node (array) or
// []kv (object, in generation order).
type node struct{ v any }

type kv struct {
	k string
	v *node
}

var runePools = [][]rune{
	[]rune("abcxyzABC019_-. "),
	{0, 1, 0x1f, '\b', '\f', '\n', '\r', '\t', '"', '\\', '/', 0x7f},
	{0x80, 0xe9, 0xf6, 0x20ac, 0x2028, 0x2029, 0xd7ff, 0xe000, 0xfb33, 0xfeff, 0xfffd, 0xffff},
	{0x10000, 0x1f600, 0x1f4a9, 0x10ffff},
}

func genString(r *rand.Rand, maxLen int) string {
	var sb strings.Builder
	for range r.IntN(maxLen + 1) {
		pool := runePools[r.IntN(len(runePools))]
		sb.WriteRune(pool[r.IntN(len(pool))])
	}
	return sb.String()
}

func genNumber(r *rand.Rand) float64 {
	switch r.IntN(6) {
	case 0:
		return float64(r.IntN(2000) - 1000)
	case 1:
		return float64(r.IntN(1000000)) / 100
	case 2:
		return float64(r.Int64N(1<<53)) * float64(1-2*r.IntN(2))
	case 3:
		return math.Pow(10, float64(r.IntN(60)-30)) * (1 + float64(r.IntN(9)))
	default:
		for {
			f := math.Float64frombits(r.Uint64())
			if !math.IsNaN(f) && !math.IsInf(f, 0) {
				return f
			}
		}
	}
}

func genValue(r *rand.Rand, depth int) *node {
	k := r.IntN(7)
	if depth >= 4 && k >= 5 {
		k = r.IntN(5)
	}
	switch k {
	case 0:
		return &node{nil}
	case 1:
		return &node{r.IntN(2) == 0}
	case 2, 3:
		return &node{genNumber(r)}
	case 4:
		return &node{genString(r, 8)}
	case 5:
		var a []*node
		for range r.IntN(5) {
			a = append(a, genValue(r, depth+1))
		}
		return &node{a}
	default:
		seen := map[string]bool{}
		o := []kv{}
		for range r.IntN(6) {
			key := genString(r, 4)
			if seen[key] {
				continue
			}
			seen[key] = true
			o = append(o, kv{key, genValue(r, depth+1)})
		}
		return &node{o}
	}
}

// style says how to spell a value: member order, whitespace, string escapes
// and number spellings vary; the meaning does not.
type style struct {
	r       *rand.Rand
	plain   bool // no variation: the reference spelling
	shuffle bool
}

func (s style) ws(b *bytes.Buffer) {
	if s.plain {
		return
	}
	for range s.r.IntN(3) {
		b.WriteByte(" \t\n\r"[s.r.IntN(4)])
	}
}

func (s style) str(b *bytes.Buffer, str string) {
	b.WriteByte('"')
	for _, c := range str {
		escape := c < 0x20 || c == '"' || c == '\\' || (!s.plain && s.r.IntN(4) == 0)
		switch {
		case !escape:
			b.WriteRune(c)
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteRune(c)
		case c == '\n' && (s.plain || s.r.IntN(2) == 0):
			b.WriteString(`\n`)
		case c == '/' && !s.plain:
			b.WriteString(`\/`)
		case c >= 0x10000:
			hi, lo := utf16.EncodeRune(c)
			fmt.Fprintf(b, `\u%04x\u%04X`, hi, lo)
		default:
			fmt.Fprintf(b, `\u%04x`, c)
		}
	}
	b.WriteByte('"')
}

func (s style) num(b *bytes.Buffer, f float64) {
	if s.plain {
		b.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
		return
	}
	switch s.r.IntN(5) {
	case 0:
		b.WriteString(strconv.FormatFloat(f, 'e', -1, 64))
	case 1:
		b.WriteString(strconv.FormatFloat(f, 'E', 25, 64)) // extra digits, same double
	case 2:
		if f == math.Trunc(f) && math.Abs(f) < 1e15 {
			fmt.Fprintf(b, "%s.000", strconv.FormatFloat(f, 'f', -1, 64))
			return
		}
		fallthrough
	default:
		b.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	}
}

func (s style) write(b *bytes.Buffer, n *node) {
	s.ws(b)
	switch v := n.v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case float64:
		s.num(b, v)
	case string:
		s.str(b, v)
	case []*node:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			s.write(b, e)
		}
		s.ws(b)
		b.WriteByte(']')
	case []kv:
		order := make([]kv, len(v))
		copy(order, v)
		if s.shuffle {
			s.r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		b.WriteByte('{')
		for i, m := range order {
			if i > 0 {
				b.WriteByte(',')
			}
			s.ws(b)
			s.str(b, m.k)
			s.ws(b)
			b.WriteByte(':')
			s.write(b, m.v)
		}
		s.ws(b)
		b.WriteByte('}')
	}
	s.ws(b)
}

func spell(n *node, s style) []byte {
	var b bytes.Buffer
	s.write(&b, n)
	return b.Bytes()
}

// leaves returns pointers to every scalar in the tree.
func leaves(n *node, out []*node) []*node {
	switch v := n.v.(type) {
	case []*node:
		for _, e := range v {
			out = leaves(e, out)
		}
	case []kv:
		for _, m := range v {
			out = leaves(m.v, out)
		}
	default:
		out = append(out, n)
	}
	return out
}

// mutate changes a scalar to a different JSON value.
func mutate(n *node) {
	switch v := n.v.(type) {
	case nil:
		n.v = false
	case bool:
		n.v = !v
	case string:
		n.v = v + "x"
	case float64:
		next := v + 1
		if next == v { // beyond 2^53
			next = v / 2
		}
		n.v = next
	}
}

func TestJSON_Properties(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		tree := genValue(r, 0)
		plain := spell(tree, style{plain: true})
		want, err := jcs.Transform(plain)
		if err != nil {
			t.Fatalf("oracle rejects %q: %v", plain, err)
		}
		got, err := canon.JSON(plain)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("case %d: JSON(%q)\n got %q, %v\nwant %q", i, plain, got, err, want)
		}
		// Idempotent.
		if again, err := canon.JSON(got); err != nil || !bytes.Equal(again, got) {
			t.Fatalf("case %d: JSON(JSON(x)) = %q, %v; want %q", i, again, err, got)
		}
		// Same value as the input.
		var a, b any
		if err := json.Unmarshal(plain, &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &b); err != nil {
			t.Fatalf("case %d: output does not parse: %v", i, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("case %d: output %q parses to another value than %q", i, got, plain)
		}
		// Permuted members, whitespace, escapes and number spellings:
		// same canonical form.
		for range 3 {
			variant := spell(tree, style{r: r, shuffle: true})
			if v, err := canon.JSON(variant); err != nil || !bytes.Equal(v, want) {
				t.Fatalf("case %d: variant %q\n gives %q, %v\n want %q", i, variant, v, err, want)
			}
		}
		// Changing any one value changes it.
		for _, leaf := range leaves(tree, nil) {
			saved := leaf.v
			mutate(leaf)
			changed, err := canon.JSON(spell(tree, style{r: r, shuffle: true}))
			leaf.v = saved
			if err != nil || bytes.Equal(changed, want) {
				t.Fatalf("case %d: changing %v to another value left %q unchanged (%v)", i, saved, want, err)
			}
		}
	}
}

func TestJSON_NumbersMatchOracle(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	check := func(lit string) {
		t.Helper()
		got, err := canon.JSON([]byte(lit))
		want, werr := jcs.Transform([]byte(lit))
		if (err != nil) != (werr != nil) || !bytes.Equal(got, want) {
			t.Fatalf("JSON(%s) = %s, %v; oracle %s, %v", lit, got, err, want, werr)
		}
		if err != nil {
			return
		}
		f1, _ := strconv.ParseFloat(lit, 64)
		f2, _ := strconv.ParseFloat(string(got), 64)
		if f1 != f2 {
			t.Fatalf("JSON(%s) = %s changes the double", lit, got)
		}
	}
	for range 100000 {
		f := math.Float64frombits(r.Uint64())
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		check(strconv.FormatFloat(f, 'g', -1, 64))
		check(strconv.FormatFloat(f, 'e', r.IntN(20), 64))
	}
	digits := func(n int, lead bool) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('0' + r.IntN(10))
		}
		if lead && n > 0 && b[0] == '0' {
			b[0] = byte('1' + r.IntN(9))
		}
		return string(b)
	}
	for range 100000 {
		var sb strings.Builder
		if r.IntN(2) == 0 {
			sb.WriteByte('-')
		}
		if n := r.IntN(25); n == 0 {
			sb.WriteByte('0')
		} else {
			sb.WriteString(digits(n, true))
		}
		if r.IntN(2) == 0 {
			sb.WriteByte('.')
			if r.IntN(3) == 0 {
				sb.WriteString(strings.Repeat("0", r.IntN(9)))
			}
			sb.WriteString(digits(1+r.IntN(20), false))
		}
		if r.IntN(4) == 0 {
			sb.WriteString([]string{"e", "E", "e+", "e-", "E-"}[r.IntN(5)])
			sb.WriteString(strconv.Itoa(r.IntN(400)))
		}
		check(sb.String())
	}
}
