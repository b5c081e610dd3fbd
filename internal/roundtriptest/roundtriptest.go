// Package roundtriptest holds the HTTP client steps the tests of
// claim/claimclient and claim/claimhttp share: a POST request that can be
// sent again, one round trip through a transport with its body read, and a
// body read that fails the test. It imports testing: for tests only.
package roundtriptest

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Post returns a POST request of body to url. Its body is a
// strings.Reader, so http.NewRequest sets GetBody and a transport can send
// it again.
func Post(t testing.TB, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body)) // sets GetBody
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// Send makes one round trip of req through tr, failing the test when it
// returns an error, and returns the response with its body read and
// closed.
func Send(t testing.TB, tr http.RoundTripper, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	defer resp.Body.Close()
	return resp, ReadAll(t, resp.Body)
}

// ReadAll reads r to its end, failing the test on a read error.
func ReadAll(t testing.TB, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
