package canon_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gowebpki/jcs"
	"github.com/oncekey/oncekey/canon"
)

// BenchmarkJSON compares canon.JSON, gowebpki/jcs and an encoding/json
// Unmarshal+Marshal round trip on the same bodies, in one run.
func BenchmarkJSON(b *testing.B) {
	for _, size := range []int{2 << 10, 31 << 10, 64 << 10} {
		body := realisticBody(size)
		name := fmt.Sprintf("%dKB", size>>10)
		b.Run(name+"/canon", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := canon.JSON(body); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/jcs", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := jcs.Transform(body); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/encoding_json", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var v any
				if err := json.Unmarshal(body, &v); err != nil {
					b.Fatal(err)
				}
				if _, err := json.Marshal(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRequest measures a whole request fingerprint (body read,
// canonicalization, hashing) on a ~31 KB JSON body.
func BenchmarkRequest(b *testing.B) {
	body := realisticBody(31 << 10)
	opts := canon.Options{Operation: "orders.create", Headers: []string{"Content-Language"}, Exclude: []string{"/created_at"}}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/orders?b=2&a=1", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if _, err := canon.Request(r, opts); err != nil {
			b.Fatal(err)
		}
	}
}
