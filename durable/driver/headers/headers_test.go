package headers_test

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/oncekey/oncekey/durable/driver/headers"
)

func TestEncode_RoundTripsEveryByte(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	for name, h := range map[string]map[string][]string{
		"etag with obs-text": {"Etag": {"\"\x80\xff\xfe\""}},
		"every byte":         {string(all): {string(all), "", string(all[128:])}},
		"several fields": {
			"Content-Type": {"application/json"},
			"Set-Cookie":   {"a=1", "b=2", ""},
			"X-Empty":      {},
			"X-Nil":        nil,
			"\xff":         {"z"},
			"10:":          {"1:"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := headers.Encode(h)
			got, err := headers.Decode(b)
			if err != nil {
				t.Fatalf("Decode(%q) = %v", b, err)
			}
			if !maps.EqualFunc(got, h, slices.Equal[[]string]) {
				t.Fatalf("round trip = %q; want %q", got, h)
			}
			for k, v := range got {
				if v == nil {
					t.Fatalf("field %q decoded to a nil list", k)
				}
			}
			if again := headers.Encode(got); !bytes.Equal(again, b) {
				t.Fatalf("not deterministic: %q then %q", b, again)
			}
		})
	}
}

func TestEncode_Format(t *testing.T) {
	h := map[string][]string{"B": {"x", ""}, "A": {}, "\xc3\xa9": {"\x80"}}
	want := "h1" + "1:A0:" + "1:B2:1:x0:" + "2:\xc3\xa91:1:\x80"
	if got := string(headers.Encode(h)); got != want {
		t.Fatalf("Encode = %q; want %q", got, want)
	}
	if headers.Encode(nil) != nil || headers.Encode(map[string][]string{}) != nil {
		t.Fatal("an empty map must encode to nil (stored as NULL)")
	}
	if h, err := headers.Decode(nil); h != nil || err != nil {
		t.Fatalf("Decode(nil) = %v, %v", h, err)
	}
}

func TestDecode_RejectsCorruptInput(t *testing.T) {
	for _, b := range []string{
		"x1", "h", "h11", "h11:", "h11:A", "h11:A1", "h11:A1:", "h11:A1:2:x",
		"h101:A0:", "h11:A01:1:x", "h11:B0:1:A0:", "h11:A0:1:A0:",
		"h199999999999:A0:", "h11:A9999999:",
	} {
		if h, err := headers.Decode([]byte(b)); !errors.Is(err, headers.ErrCorrupt) {
			t.Errorf("Decode(%q) = %v, %v; want ErrCorrupt", b, h, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("h11:A0:1:B2:1:x0:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := headers.Decode(b)
		if err != nil {
			return
		}
		if len(b) > 2 && !bytes.Equal(headers.Encode(h), b) && len(h) > 0 {
			t.Fatalf("Decode(%q) accepted a non-canonical encoding", b)
		}
	})
}
