package claimhttp_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
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
		{"Missing", nil, "", claimhttp.ErrKeyMissing},
		{"TwoFieldLines", []string{`"a"`, `"a"`}, "", claimhttp.ErrKeyInvalid},
		{"Empty", []string{""}, "", claimhttp.ErrKeyInvalid},
		{"EmptyString", []string{`""`}, "", claimhttp.ErrKeyInvalid},
		{"TooLong", []string{`"` + long + `k"`}, "", claimhttp.ErrKeyInvalid},
		{"BareTooLong", []string{long + "k"}, "", claimhttp.ErrKeyInvalid},
		{"Unterminated", []string{`"abc`}, "", claimhttp.ErrKeyInvalid},
		{"EndsInEscape", []string{`"abc\`}, "", claimhttp.ErrKeyInvalid},
		{"UnknownEscape", []string{`"a\nb"`}, "", claimhttp.ErrKeyInvalid},
		{"Parameters", []string{`"abc";v=1`}, "", claimhttp.ErrKeyInvalid},
		{"TwoStrings", []string{`"a", "b"`}, "", claimhttp.ErrKeyInvalid},
		{"BareList", []string{"a,b"}, "", claimhttp.ErrKeyInvalid},
		{"BareSpace", []string{"a b"}, "", claimhttp.ErrKeyInvalid},
		{"BareParameter", []string{"a;b"}, "", claimhttp.ErrKeyInvalid},
		{"BareQuoteInside", []string{`a"b`}, "", claimhttp.ErrKeyInvalid},
		{"NonASCIIQuoted", []string{"\"caf\xc3\xa9\""}, "", claimhttp.ErrKeyInvalid},
		{"NonASCIIBare", []string{"caf\xc3\xa9"}, "", claimhttp.ErrKeyInvalid},
		{"ControlQuoted", []string{"\"a\x01b\""}, "", claimhttp.ErrKeyInvalid},
		{"TabInsideQuoted", []string{"\"a\tb\""}, "", claimhttp.ErrKeyInvalid},
		{"ByteSequence", []string{":aGVsbG8=:"}, ":aGVsbG8=:", nil}, // a bare key, not an sf-binary
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for _, l := range tt.lines {
				h.Add("Idempotency-Key", l)
			}
			got, err := claimhttp.ParseKey(h, "")
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
	if got, err := claimhttp.ParseKey(h, "x-request-key"); err != nil || got != "abc" {
		t.Fatalf("ParseKey = %q, %v", got, err)
	}
	if _, err := claimhttp.ParseKey(h, ""); !errors.Is(err, claimhttp.ErrKeyMissing) {
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
		got, err := claimhttp.FormatKey(key)
		if err != nil || got != want {
			t.Errorf("FormatKey(%q) = %q, %v; want %q", key, got, err, want)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", 256), "é", "a\nb"} {
		if _, err := claimhttp.FormatKey(bad); !errors.Is(err, claimhttp.ErrKeyInvalid) {
			t.Errorf("FormatKey(%q) err = %v, want ErrKeyInvalid", bad, err)
		}
	}
}

func TestNewKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		k, err := claimhttp.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		if len(k) != 32 || strings.Trim(k, "0123456789abcdef") != "" {
			t.Fatalf("NewKey = %q, want 32 hex characters", k)
		}
		if seen[k] {
			t.Fatalf("NewKey repeated %q", k)
		}
		seen[k] = true
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
		key, err := claimhttp.ParseKey(h, "")
		if err != nil {
			if !errors.Is(err, claimhttp.ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q) error %v does not match ErrKeyInvalid", v, err)
			}
		} else if verr := durable.ValidateKey(key); verr != nil {
			t.Fatalf("ParseKey(%q) = %q, which is not a valid key: %v", v, key, verr)
		}
		// Round trip: any valid key, formatted, parses back to itself.
		if durable.ValidateKey(v) == nil {
			q, err := claimhttp.FormatKey(v)
			if err != nil {
				t.Fatalf("FormatKey(%q): %v", v, err)
			}
			back, err := claimhttp.ParseKey(http.Header{"Idempotency-Key": {q}}, "")
			if err != nil || back != v {
				t.Fatalf("ParseKey(FormatKey(%q)) = %q, %v", v, back, err)
			}
		}
	})
}
