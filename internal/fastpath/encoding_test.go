package fastpath

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/oncekey/oncekey/durable"
)

var encodingVectors = []struct {
	name  string
	state durable.State
	res   durable.Result
}{
	{"Zero", durable.Completed, durable.Result{}},
	{"EmptyNotNil", durable.Failed, durable.Result{Headers: map[string][]string{}, Body: []byte{}}},
	{"Full", durable.Completed, durable.Result{
		StatusCode: 201,
		Headers: map[string][]string{
			"Content-Type": {"application/json"},
			"Set-Cookie":   {"a=1", "b=2", ""},
			"X-Nil":        nil,
			"X-Empty":      {},
			"":             {"empty name"},
		},
		Body:       []byte("\x00\x01\xff\xfe binary \r\n\x00"),
		Version:    -7,
		ResourceID: "ord_\x00\u00e9",
	}},
	{"NegativeAndLargeInts", durable.Failed, durable.Result{StatusCode: -1, Version: 1 << 40}},
	{"LargeBody", durable.Completed, durable.Result{Body: bytes.Repeat([]byte{0xab}, 70000)}},
}

func TestResultEncoding_RoundTrip(t *testing.T) {
	t.Parallel()
	for _, v := range encodingVectors {
		t.Run(v.name, func(t *testing.T) {
			b := encodeResult(v.state, v.res)
			state, res, err := decodeResult(b)
			if err != nil {
				t.Fatal(err)
			}
			if state != v.state || !reflect.DeepEqual(res, v.res) {
				t.Fatalf("decode(encode(x)) = %q %#v\nwant %q %#v", state, res, v.state, v.res)
			}
			if again := encodeResult(state, res); !bytes.Equal(again, b) {
				t.Fatal("encoding is not deterministic")
			}
		})
	}
}

func TestResultEncoding_HeaderOrderDoesNotMatter(t *testing.T) {
	t.Parallel()
	// Go randomizes map iteration; the encoding must not depend on it, or a
	// re-run of complete.lua would see a different blob.
	h := map[string][]string{}
	for _, k := range []string{"A", "B", "C", "D", "E", "F", "G", "H"} {
		h[k] = []string{k}
	}
	first := encodeResult(durable.Completed, durable.Result{Headers: h})
	for range 50 {
		if !bytes.Equal(encodeResult(durable.Completed, durable.Result{Headers: h}), first) {
			t.Fatal("encoding depends on map order")
		}
	}
}

func TestResultEncoding_RejectsNonCanonical(t *testing.T) {
	t.Parallel()
	good := encodeResult(durable.Completed, encodingVectors[2].res)
	bad := map[string][]byte{
		"Empty":           {},
		"UnknownVersion":  append([]byte{0x02}, good[1:]...),
		"Truncated":       good[:len(good)-1],
		"Trailing":        append(append([]byte{}, good...), 0),
		"ProcessingState": encodeResult(durable.Processing, durable.Result{}),
		"UnsortedHeaders": {resultV1, 9, 'c', 'o', 'm', 'p', 'l', 'e', 't', 'e', 'd', 0, 0, 0,
			3, 1, 'b', 0, 1, 'a', 0, 0},
		"DuplicateHeaders": {resultV1, 9, 'c', 'o', 'm', 'p', 'l', 'e', 't', 'e', 'd', 0, 0, 0,
			3, 1, 'a', 0, 1, 'a', 0, 0},
		"HugeCount": {resultV1, 9, 'c', 'o', 'm', 'p', 'l', 'e', 't', 'e', 'd', 0, 0, 0,
			0xff, 0xff, 0xff, 0xff, 0x0f},
	}
	for name, b := range bad {
		t.Run(name, func(t *testing.T) {
			if _, _, err := decodeResult(b); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decode = %v, want ErrCorrupt", err)
			}
		})
	}
}

// FuzzResultEncoding checks that decoding never panics and that whatever
// decodes is canonical: it encodes back to the same bytes.
func FuzzResultEncoding(f *testing.F) {
	for _, v := range encodingVectors {
		f.Add(encodeResult(v.state, v.res))
	}
	f.Add([]byte{resultV1})
	f.Fuzz(func(t *testing.T, b []byte) {
		state, res, err := decodeResult(b)
		if err != nil {
			return
		}
		if again := encodeResult(state, res); !bytes.Equal(again, b) {
			t.Fatalf("decoded %q %#v re-encodes to %x, input %x", state, res, again, b)
		}
	})
}
