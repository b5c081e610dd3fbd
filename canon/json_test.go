package canon_test

import (
	"encoding/hex"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
	"github.com/oncekey/oncekey/canon"
)

func mustJSON(t *testing.T, in string) string {
	t.Helper()
	out, err := canon.JSON([]byte(in))
	if err != nil {
		t.Fatalf("JSON(%q): %v", in, err)
	}
	return string(out)
}

func TestJSON_RFC8785Examples(t *testing.T) {
	t.Parallel()
	t.Run("Section3_2_2", func(t *testing.T) {
		t.Parallel()
		in := `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
		want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`
		if got := mustJSON(t, in); got != want {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("Section3_2_3Sorting", func(t *testing.T) {
		t.Parallel()
		in := `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
		want := "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\"," +
			"\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\"," +
			"\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"
		if got := mustJSON(t, in); got != want {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("AppendixBNumbers", func(t *testing.T) {
		t.Parallel()
		// IEEE-754 bit patterns and their serializations, from RFC 8785
		// Appendix B ("" marks NaN and Infinity, which JSON cannot hold).
		vectors := []struct{ bits, want string }{
			{"0000000000000000", "0"},
			{"8000000000000000", "0"},
			{"0000000000000001", "5e-324"},
			{"8000000000000001", "-5e-324"},
			{"7fefffffffffffff", "1.7976931348623157e+308"},
			{"ffefffffffffffff", "-1.7976931348623157e+308"},
			{"4340000000000000", "9007199254740992"},
			{"c340000000000000", "-9007199254740992"},
			{"4430000000000000", "295147905179352830000"},
			{"7fffffffffffffff", ""},
			{"7ff0000000000000", ""},
			{"44b52d02c7e14af5", "9.999999999999997e+22"},
			{"44b52d02c7e14af6", "1e+23"},
			{"44b52d02c7e14af7", "1.0000000000000001e+23"},
			{"444b1ae4d6e2ef4e", "999999999999999700000"},
			{"444b1ae4d6e2ef4f", "999999999999999900000"},
			{"444b1ae4d6e2ef50", "1e+21"},
			{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
			{"3eb0c6f7a0b5ed8d", "0.000001"},
			{"41b3de4355555553", "333333333.3333332"},
			{"41b3de4355555554", "333333333.33333325"},
			{"41b3de4355555555", "333333333.3333333"},
			{"41b3de4355555556", "333333333.3333334"},
			{"41b3de4355555557", "333333333.33333343"},
			{"becbf647612f3696", "-0.0000033333333333333333"},
			{"43143ff3c1cb0959", "1424953923781206.2"},
		}
		for _, v := range vectors {
			b, err := hex.DecodeString(v.bits)
			if err != nil {
				t.Fatal(err)
			}
			f := math.Float64frombits(uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
				uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7]))
			if v.want == "" {
				if !math.IsNaN(f) && !math.IsInf(f, 0) {
					t.Fatalf("%s: expected NaN or Inf", v.bits)
				}
				continue
			}
			// Several spellings of the same double all canonicalize alike.
			for _, lit := range []string{
				strconv.FormatFloat(f, 'g', -1, 64),
				strconv.FormatFloat(f, 'e', 20, 64),
				strconv.FormatFloat(f, 'E', -1, 64),
			} {
				if got := mustJSON(t, lit); got != v.want {
					t.Errorf("%s: JSON(%s) = %s, want %s", v.bits, lit, got, v.want)
				}
			}
			if got, _ := jcs.NumberToJSON(f); got != v.want {
				t.Errorf("%s: oracle says %s, vector says %s", v.bits, got, v.want)
			}
		}
	})
}

func TestJSON_Numbers(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"0", "0"}, {"-0", "0"}, {"-0.0", "0"}, {"0e10", "0"}, {"-0E-3", "0"},
		{"1", "1"}, {"-1", "-1"}, {"1.0", "1"}, {"1.50", "1.5"}, {"100", "100"},
		{"1E+2", "100"}, {"1e2", "100"}, {"2e-3", "0.002"}, {"123.456000", "123.456"},
		{"0.1", "0.1"}, {"-12.99", "-12.99"}, {"0.30000000000000004", "0.30000000000000004"},
		{"1e21", "1e+21"}, {"1E21", "1e+21"}, {"999999999999999999999", "1e+21"},
		{"1e20", "100000000000000000000"}, {"123456789012345678901", "123456789012345680000"},
		{"1e-7", "1e-7"}, {"-1.5e-7", "-1.5e-7"}, {"0.0000001", "1e-7"},
		{"0.000001", "0.000001"}, {"0.0000010", "0.000001"}, {"0.00000123", "0.00000123"},
		{"0.000000123", "1.23e-7"}, {"1e-6", "0.000001"},
		{"5e-324", "5e-324"}, {"4.9406564584124654e-324", "5e-324"},
		{"1.7976931348623157e308", "1.7976931348623157e+308"},
		{"-1.7976931348623157E+308", "-1.7976931348623157e+308"},
		{"1e-400", "0"}, {"-1e-400", "0"},
		{"123456789012345", "123456789012345"}, {"1234567890123456", "1234567890123456"},
		{"9007199254740992", "9007199254740992"}, {"9007199254740993", "9007199254740992"},
		{"-9007199254740993", "-9007199254740992"}, {"18446744073709551615", "18446744073709552000"},
		{"0.1234567890123456789", "0.12345678901234568"}, {"3.141592653589793238", "3.141592653589793"},
		{"1e0", "1"}, {"1.5e1", "15"}, {"25e-1", "2.5"},
	}
	for _, c := range cases {
		if got := mustJSON(t, c.in); got != c.want {
			t.Errorf("JSON(%s) = %s, want %s", c.in, got, c.want)
		}
		if got := mustJSON(t, "["+c.in+"]"); got != "["+c.want+"]" {
			t.Errorf("JSON([%s]) = %s, want [%s]", c.in, got, c.want)
		}
	}
	for _, in := range []string{"1E400", "-1E400", "1e309", "1.7976931348623159e308", strings.Repeat("9", 400)} {
		_, err := canon.JSON([]byte(`{"n":` + in + `}`))
		if !errors.Is(err, canon.ErrOverflow) || !errors.Is(err, canon.ErrInvalid) {
			t.Errorf("JSON(%s): err = %v, want ErrNumberOverflow", in, err)
		}
	}
}

func TestJSON_Strings(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`""`, `""`},
		{`"plain"`, `"plain"`},
		{`"\u0000"`, `"\u0000"`},
		{`"\u001F\u001f"`, `"\u001f\u001f"`},
		{`"\u0007"`, `"\u0007"`},
		{`"\u0008\u000C\u000a\u000D\u0009"`, `"\b\f\n\r\t"`},
		{`"\b\f\n\r\t"`, `"\b\f\n\r\t"`},
		{`"\u007f"`, "\"\x7f\""},
		{"\"\x7f\"", "\"\x7f\""},
		{`"\/"`, `"/"`},
		{`"\u00e9\u00E9é"`, `"ééé"`},
		{`"\u2028\u2029"`, "\"\u2028\u2029\""},
		{`"\ud83d\ude00😀"`, `"😀😀"`},
		{`"\uDBFF\uDFFF"`, "\"\U0010FFFF\""},
		{`"\""`, `"\""`},
		{`"\\"`, `"\\"`},
		{`"\u0022\u005c"`, `"\"\\"`},
		{`"a\"b\\c\nd"`, `"a\"b\\c\nd"`},
		{`"\uFFFD"`, "\"\uFFFD\""},
		{"\"\uFEFF\"", "\"\uFEFF\""},
		{`"<>&'"`, `"<>&'"`},
	}
	for _, c := range cases {
		if got := mustJSON(t, c.in); got != c.want {
			t.Errorf("JSON(%s) = %s, want %s", c.in, got, c.want)
		}
		// As a member name too.
		if got := mustJSON(t, "{"+c.in+":1}"); got != "{"+c.want+":1}" {
			t.Errorf("JSON({%s:1}) = %s, want {%s:1}", c.in, got, c.want)
		}
	}
}

func TestJSON_Sorting(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{`{"aa":1,"a":2,"":3,"b":4}`, `{"":3,"a":2,"aa":1,"b":4}`},
		{`{"B":1,"a":2,"_":3}`, `{"B":1,"_":3,"a":2}`},
		// U+FB33 is after U+1F600 in UTF-8 bytes (EF < F0) but before it
		// in UTF-16 code units (FB33 > D83D): UTF-16 wins.
		{"{\"\uFB33\":1,\"\U0001F600\":2}", "{\"\U0001F600\":2,\"\uFB33\":1}"},
		{"{\"\U0001F600\":2,\"\uFB33\":1}", "{\"\U0001F600\":2,\"\uFB33\":1}"},
		{"{\"\uE000\":1,\"\U00010000\":2,\"\uD7FF\":3,\"\uFFFF\":4}", "{\"\uD7FF\":3,\"\U00010000\":2,\"\uE000\":1,\"\uFFFF\":4}"},
		{"{\"x\uFFFF\":1,\"x\U0010FFFF\":2,\"x\":3}", "{\"x\":3,\"x\U0010FFFF\":2,\"x\uFFFF\":1}"},
		// Escaped and literal spellings of names sort by the decoded text.
		{`{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{`{"\n":1,"\u0000":2," ":3}`, `{"\u0000":2,"\n":1," ":3}`},
		// Nested objects are sorted too; arrays keep their order.
		{`{"z":{"y":1,"x":[{"b":1,"a":2},3]},"a":null}`, `{"a":null,"z":{"x":[{"a":2,"b":1},3],"y":1}}`},
		{" \t\n\r[ 3 , 1 , {} , [ ] , true , false , null ] \n", `[3,1,{},[],true,false,null]`},
	}
	for _, c := range cases {
		if got := mustJSON(t, c.in); got != c.want {
			t.Errorf("JSON(%s)\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

func TestJSON_Errors(t *testing.T) {
	t.Parallel()
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	cases := []struct {
		in   string
		want error
	}{
		{"", canon.ErrSyntax},
		{" \n", canon.ErrSyntax},
		{"{", canon.ErrSyntax},
		{"}", canon.ErrSyntax},
		{"[1,]", canon.ErrSyntax},
		{"[,1]", canon.ErrSyntax},
		{"[1 2]", canon.ErrSyntax},
		{`{"a":1,}`, canon.ErrSyntax},
		{`{"a" 1}`, canon.ErrSyntax},
		{`{a:1}`, canon.ErrSyntax},
		{`{"a":1}{}`, canon.ErrSyntax},
		{`{"a":1} x`, canon.ErrSyntax},
		{"tru", canon.ErrSyntax},
		{"nul", canon.ErrSyntax},
		{"True", canon.ErrSyntax},
		{"NaN", canon.ErrSyntax},
		{"Infinity", canon.ErrSyntax},
		{"01", canon.ErrSyntax},
		{"-", canon.ErrSyntax},
		{"+1", canon.ErrSyntax},
		{"1.", canon.ErrSyntax},
		{".5", canon.ErrSyntax},
		{"1e", canon.ErrSyntax},
		{"1e+", canon.ErrSyntax},
		{"0x10", canon.ErrSyntax},
		{"1_000", canon.ErrSyntax},
		{`"abc`, canon.ErrSyntax},
		{`"\x"`, canon.ErrSyntax},
		{`"\u12"`, canon.ErrSyntax},
		{`"\u12G4"`, canon.ErrSyntax},
		{`"\`, canon.ErrSyntax},
		{"\"a\nb\"", canon.ErrSyntax},
		{"\"a\tb\"", canon.ErrSyntax},
		{"\"\x00\"", canon.ErrSyntax},
		{"\xef\xbb\xbf{}", canon.ErrSyntax}, // a byte order mark
		{"[\xe2\x80\xa8]", canon.ErrSyntax}, // U+2028 outside a string
		{"\"\xff\"", canon.ErrUTF8},
		{"\"\xc0\xaf\"", canon.ErrUTF8},         // overlong '/'
		{"\"\xed\xa0\x80\"", canon.ErrUTF8},     // UTF-8-encoded surrogate
		{"\"\xf4\x90\x80\x80\"", canon.ErrUTF8}, // beyond U+10FFFF
		{"\"\xe2\x82\"", canon.ErrUTF8},         // truncated
		{"\"\\n\xff\"", canon.ErrUTF8},          // after an escape
		{"{\"\xff\":1}", canon.ErrUTF8},
		{`"\ud800"`, canon.ErrSurrogate},
		{`"\udc00"`, canon.ErrSurrogate},
		{`"\ud800\u0041"`, canon.ErrSurrogate},
		{`"\ud800\ud800"`, canon.ErrSurrogate},
		{`"\ude00\ud83d"`, canon.ErrSurrogate},
		{`"\ud83dx"`, canon.ErrSurrogate},
		{`{"\udfff":1}`, canon.ErrSurrogate},
		{`{"a":1,"a":2}`, canon.ErrDuplicate},
		{`{"a":1,"b":2,"a":1}`, canon.ErrDuplicate},
		{`{"a":1,"\u0061":2}`, canon.ErrDuplicate},
		{`{"é":1,"\u00e9":2}`, canon.ErrDuplicate},
		{`[{"x":{"k":1,"k":1}}]`, canon.ErrDuplicate},
		{"1e400", canon.ErrOverflow},
		{deep(canon.MaxDepth + 1), canon.ErrTooDeep},
		{strings.Repeat(`{"a":`, canon.MaxDepth+1) + "1" + strings.Repeat("}", canon.MaxDepth+1), canon.ErrTooDeep},
		{strings.Repeat("[", 100000), canon.ErrTooDeep},
	}
	for _, c := range cases {
		out, err := canon.JSON([]byte(c.in))
		if !errors.Is(err, c.want) || !errors.Is(err, canon.ErrInvalid) {
			t.Errorf("JSON(%q) = %q, %v; want %v", c.in, out, err, c.want)
			continue
		}
		var se *canon.SyntaxError
		if !errors.As(err, &se) || se.Offset < 0 || se.Offset > int64(len(c.in)) {
			t.Errorf("JSON(%q): %v is not a *SyntaxError with an offset in range", c.in, err)
		}
		if errors.Is(err, canon.ErrPrecision) || errors.Is(err, canon.ErrTooLarge) {
			t.Errorf("JSON(%q): %v matches an unrelated sentinel", c.in, err)
		}
	}
	// The deepest accepted nesting.
	if got := mustJSON(t, deep(canon.MaxDepth)); got != deep(canon.MaxDepth) {
		t.Errorf("nesting of MaxDepth rejected or altered")
	}
}

func TestJSON_ErrorOffsets(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		off  int64
		want error
	}{
		{`{"a":1,"b":2 "c":3}`, 13, canon.ErrSyntax},
		{"[\"ok\",\"\xff\"]", 7, canon.ErrUTF8},
		{`[1, "\ud800"]`, 5, canon.ErrSurrogate},
		{`[0, 1e999]`, 4, canon.ErrOverflow},
		{`[[], {"k":1, "k":2}]`, 5, canon.ErrDuplicate},
	}
	for _, c := range cases {
		_, err := canon.JSON([]byte(c.in))
		var se *canon.SyntaxError
		if !errors.As(err, &se) || se.Offset != c.off || !errors.Is(err, c.want) {
			t.Errorf("JSON(%q) = %v; want %v at offset %d", c.in, err, c.want, c.off)
		}
	}
}

func TestJSON_ErrorsDoNotQuoteInput(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"secret-token-123":1,"secret-token-123":2}`,
		`{"card":"secret-token-123` + "\xff" + `"}`,
		`{"id":secret-token-123}`,
		`{"n":1e999999,"secret-token-123":0}`,
	} {
		_, err := canon.JSON([]byte(in))
		if err == nil {
			t.Fatalf("JSON(%q) succeeded", in)
		}
		if msg := err.Error(); strings.Contains(msg, "secret") || !strings.HasPrefix(msg, "canon: ") {
			t.Errorf("error message %q quotes the input or lacks the package prefix", msg)
		}
	}
}

func TestJSON_DoesNotModifyOrRetainInput(t *testing.T) {
	t.Parallel()
	in := []byte(`{"b":"\u00e9x","a":[1.50,2e3,"plain"]}`)
	orig := string(in)
	out, err := canon.JSON(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(in) != orig {
		t.Fatalf("input modified: %s", in)
	}
	want := string(out)
	for i := range in {
		in[i] = 'x'
	}
	if string(out) != want {
		t.Fatalf("output aliases the input: %s", out)
	}
}

func TestJSONStrict_Precision(t *testing.T) {
	t.Parallel()
	accept := map[string]string{
		`{"id":9007199254740992}`:           `{"id":9007199254740992}`,
		`{"id":-9007199254740992}`:          `{"id":-9007199254740992}`,
		`{"id":"9007199254740993"}`:         `{"id":"9007199254740993"}`,
		`{"id":18014398509481984}`:          `{"id":18014398509481984}`, // 2^54 prints exactly
		`{"n":-0}`:                          `{"n":0}`,
		`{"n":1e21,"m":9007199254740993.0}`: `{"m":9007199254740992,"n":1e+21}`, // only plain integers are checked
		`[100000000000000000000]`:           `[100000000000000000000]`,
	}
	for in, want := range accept {
		out, err := canon.JSONStrict([]byte(in))
		if err != nil || string(out) != want {
			t.Errorf("JSONStrict(%s) = %s, %v; want %s", in, out, err, want)
		}
	}
	for _, in := range []string{
		`{"id":9007199254740993}`,
		`{"id":-9007199254740993}`,
		`{"id":123456789012345678}`, // prints as 123456789012345680
		`[1000000000000000000000]`,  // prints as 1e+21
		`{"a":{"b":[1,2,18446744073709551615]}}`,
	} {
		out, err := canon.JSONStrict([]byte(in))
		if !errors.Is(err, canon.ErrPrecision) || !errors.Is(err, canon.ErrInvalid) || errors.Is(err, canon.ErrSyntax) {
			t.Errorf("JSONStrict(%s) = %s, %v; want ErrInvalid for precision, not a syntax error", in, out, err)
		}
		var se *canon.SyntaxError
		if !errors.As(err, &se) || se.Offset <= 0 {
			t.Errorf("JSONStrict(%s): want a *SyntaxError with the offset, got %v", in, err)
		}
		// JSON follows the RFC and rounds.
		if _, err := canon.JSON([]byte(in)); err != nil {
			t.Errorf("JSON(%s): %v", in, err)
		}
	}
}

func TestJSON_ConcurrentUse(t *testing.T) {
	t.Parallel()
	// The parser state is pooled; results must never mix between callers.
	inputs := []string{
		realisticBodyString(2 << 10),
		`{"b":"\u00e9","a":[1.50,{"d":1,"c":2}]}`,
		`[9007199254740993,"x\ny"]`,
		realisticBodyString(20 << 10),
	}
	wants := make([]string, len(inputs))
	for i, in := range inputs {
		wants[i] = mustJSON(t, in)
	}
	done := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 200 {
				k := (g + i) % len(inputs)
				out, err := canon.JSON([]byte(inputs[k]))
				if err != nil || string(out) != wants[k] {
					done <- errors.New("concurrent JSON result differs")
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func realisticBodyString(n int) string { return string(realisticBody(n)) }

func TestJSON_LargeInputs(t *testing.T) {
	t.Parallel()
	// Many members, in reverse order, and deeply nested unsorted objects.
	var sb strings.Builder
	sb.WriteByte('{')
	const n = 50000
	for i := n - 1; i >= 0; i-- {
		if i < n-1 {
			sb.WriteByte(',')
		}
		sb.WriteString(`"k` + strconv.Itoa(100000+i) + `":` + strconv.Itoa(i))
	}
	sb.WriteByte('}')
	out := mustJSON(t, sb.String())
	if !strings.HasPrefix(out, `{"k100000":0,"k100001":1,`) || !strings.HasSuffix(out, `"k149999":49999}`) {
		t.Fatalf("large object not sorted: %s...%s", out[:40], out[len(out)-40:])
	}
	nested := strings.Repeat(`{"b":0,"a":`, canon.MaxDepth-1) + "{}" + strings.Repeat("}", canon.MaxDepth-1)
	want := strings.Repeat(`{"a":`, canon.MaxDepth-1) + "{}" + strings.Repeat(`,"b":0}`, canon.MaxDepth-1)
	if got := mustJSON(t, nested); got != want {
		t.Fatal("deep unsorted nesting canonicalized wrongly")
	}
}
