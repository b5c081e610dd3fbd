package wire_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/wire"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 255)
	tests := []struct {
		name  string
		lines []string
		want  string // "" means an error
		err   error
	}{
		{"QuotedUUID", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"BareUUID", []string{`8e03978e-40d5-43e8-bc93-6894a57f9324`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"QuotedWithEscapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"QuotedWithSpaces", []string{`"order 42"`}, "order 42", nil},
		{"SurroundingWhitespace", []string{" \t\"k1\" \t"}, "k1", nil},
		{"QuotedMaxLength", []string{`"` + long + `"`}, long, nil},
		{"BareMaxLength", []string{long}, long, nil},
		{"BarePunctuation", []string{"a:b/c=d+e{f}"}, "a:b/c=d+e{f}", nil},
		{"Missing", nil, "", wire.ErrKeyMissing},
		{"TwoFieldLines", []string{`"a"`, `"a"`}, "", wire.ErrKeyInvalid},
		{"Empty", []string{""}, "", wire.ErrKeyInvalid},
		{"EmptyString", []string{`""`}, "", wire.ErrKeyInvalid},
		{"TooLong", []string{`"` + long + `k"`}, "", wire.ErrKeyInvalid},
		{"BareTooLong", []string{long + "k"}, "", wire.ErrKeyInvalid},
		{"Unterminated", []string{`"abc`}, "", wire.ErrKeyInvalid},
		{"EndsInEscape", []string{`"abc\`}, "", wire.ErrKeyInvalid},
		{"UnknownEscape", []string{`"a\nb"`}, "", wire.ErrKeyInvalid},
		{"Parameters", []string{`"abc";v=1`}, "", wire.ErrKeyInvalid},
		{"TwoStrings", []string{`"a", "b"`}, "", wire.ErrKeyInvalid},
		{"BareList", []string{"a,b"}, "", wire.ErrKeyInvalid},
		{"BareSpace", []string{"a b"}, "", wire.ErrKeyInvalid},
		{"BareParameter", []string{"a;b"}, "", wire.ErrKeyInvalid},
		{"BareQuoteInside", []string{`a"b`}, "", wire.ErrKeyInvalid},
		{"NonASCIIQuoted", []string{"\"caf\xc3\xa9\""}, "", wire.ErrKeyInvalid},
		{"NonASCIIBare", []string{"caf\xc3\xa9"}, "", wire.ErrKeyInvalid},
		{"ControlQuoted", []string{"\"a\x01b\""}, "", wire.ErrKeyInvalid},
		{"TabInsideQuoted", []string{"\"a\tb\""}, "", wire.ErrKeyInvalid},
		{"ByteSequence", []string{":aGVsbG8=:"}, ":aGVsbG8=:", nil}, // a bare key, not an sf-binary
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for _, l := range tt.lines {
				h.Add("Idempotency-Key", l)
			}
			got, err := wire.ParseKey(h, "")
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("ParseKey = %q, %v; want %v", got, err, tt.err)
				}
				for _, l := range tt.lines {
					if k := strings.Trim(l, ` "`); len(k) >= 4 && strings.Contains(err.Error(), k) {
						t.Fatalf("error %q quotes the key", err)
					}
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseKey = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestParseKey_CustomHeader(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("X-Request-Key", `"abc"`)
	if got, err := wire.ParseKey(h, "x-request-key"); err != nil || got != "abc" {
		t.Fatalf("ParseKey = %q, %v", got, err)
	}
	if _, err := wire.ParseKey(h, ""); !errors.Is(err, wire.ErrKeyMissing) {
		t.Fatalf("default header: %v, want ErrKeyMissing", err)
	}
}

func TestFormatKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"abc":    `"abc"`,
		`a"b\c`:  `"a\"b\\c"`,
		"sp ace": `"sp ace"`,
	} {
		got, err := wire.FormatKey(key)
		if err != nil || got != want {
			t.Errorf("FormatKey(%q) = %q, %v; want %q", key, got, err, want)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", 256), "é", "a\nb"} {
		if _, err := wire.FormatKey(bad); !errors.Is(err, wire.ErrKeyInvalid) {
			t.Errorf("FormatKey(%q) err = %v, want ErrKeyInvalid", bad, err)
		}
	}
}

// FuzzParseKey checks that ParseKey never panics, that whatever it accepts
// is a valid key, and that FormatKey's output parses back to the key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b\\c"`, `""`, `"abc`, `"a\nb"`, `"a";b`, "a,b", " \"k\" ", `\`, `"\`, "\"\x7f\"", strings.Repeat("z", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{"Idempotency-Key": {v}}
		key, err := wire.ParseKey(h, "")
		if err != nil {
			if !errors.Is(err, wire.ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q) error %v does not match ErrKeyInvalid", v, err)
			}
		} else if verr := durable.ValidateKey(key); verr != nil {
			t.Fatalf("ParseKey(%q) = %q, which is not a valid key: %v", v, key, verr)
		}
		// Round trip: any valid key, formatted, parses back to itself.
		if durable.ValidateKey(v) == nil {
			q, err := wire.FormatKey(v)
			if err != nil {
				t.Fatalf("FormatKey(%q): %v", v, err)
			}
			back, err := wire.ParseKey(http.Header{"Idempotency-Key": {q}}, "")
			if err != nil || back != v {
				t.Fatalf("ParseKey(FormatKey(%q)) = %q, %v", v, back, err)
			}
		}
	})
}

func BenchmarkParseKey(b *testing.B) {
	h := http.Header{"Idempotency-Key": {`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}}
	for b.Loop() {
		if _, err := wire.ParseKey(h, ""); err != nil {
			b.Fatal(err)
		}
	}
}
