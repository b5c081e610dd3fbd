package claimclient_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
)

// The transport adds a key to the POST, retries the 503 with the same key
// and a jittered backoff, and returns the success.
func ExampleTransport() {
	var attempts atomic.Int32
	keys := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys <- r.Header.Get("Idempotency-Key")
		if attempts.Add(1) == 1 {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "created")
	}))
	defer srv.Close()

	tr, err := claimclient.NewTransport(nil, claimclient.WithBaseDelay(time.Millisecond))
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"item":"book"}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	first, second := <-keys, <-keys
	fmt.Println(resp.StatusCode, string(body), "after", attempts.Load(), "attempts")
	fmt.Println("quoted key:", strings.HasPrefix(first, `"`), "same key on the retry:", first == second)
	// Output:
	// 201 created after 2 attempts
	// quoted key: true same key on the retry: true
}
