package claimhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/oncekey/oncekey/claim/claimclient"
)

// BenchmarkMiddleware measures a guarded POST on PostgreSQL and Redis, in
// process (no network for the HTTP side): Execute runs the handler with a
// fresh key (claim, insert, complete in one transaction); Replay answers a
// finished key (from the Redis cache).
func BenchmarkMiddleware(b *testing.B) {
	f := setup(b, config{redis: true, tx: true})
	b.Run("Execute", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, newRequest("bench", http.MethodPost, "/orders", fmt.Sprintf("bench-exec-%d", i), `{"item":"book"}`))
			if w.Code != http.StatusCreated {
				b.Fatalf("status %d", w.Code)
			}
		}
	})
	b.Run("Replay", func(b *testing.B) {
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, newRequest("bench", http.MethodPost, "/orders", "bench-replay", `{"item":"book"}`))
		for b.Loop() {
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, newRequest("bench", http.MethodPost, "/orders", "bench-replay", `{"item":"book"}`))
			if w.Header().Get(claimclient.HeaderReplayed) != "true" {
				b.Fatalf("status %d, not replayed", w.Code)
			}
		}
	})
}
