package claimhttp_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/internal/roundtriptest"
)

// dropAfterCommit wraps the guarded service: on its first request it lets
// the middleware commit the result, then closes the connection instead of
// sending the response (the lost-response ambiguity window).
type dropAfterCommit struct {
	next     http.Handler
	requests atomic.Int64
}

func (d *dropAfterCommit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d.requests.Add(1) == 1 {
		w = &dropWriter{ResponseWriter: w}
	}
	d.next.ServeHTTP(w, r)
}

// dropWriter hijacks and closes the connection when the response starts,
// which the middleware does only after the result is durable.
type dropWriter struct {
	http.ResponseWriter
	dropped bool
}

func (d *dropWriter) WriteHeader(int) {
	if !d.dropped {
		d.dropped = true
		dropConnection(d.ResponseWriter)
	}
}

func (d *dropWriter) Write(p []byte) (int, error) {
	d.WriteHeader(0)
	return 0, http.ErrHijacked
}

func TestTransport_AgainstServerThatDropsTheResponseAfterCommit(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{redis: true, tx: mode.tx})
			d := &dropAfterCommit{next: f.h}
			srv := httptest.NewServer(d)
			defer srv.Close()
			base := &countingBase{next: &http.Transport{}}
			defer base.next.CloseIdleConnections()
			tr, err := claimclient.NewTransport(base, claimclient.WithBaseDelay(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}

			req := roundtriptest.Post(t, srv.URL+"/orders", `{"item":"book"}`)
			req.Header.Set("Authorization", "Bearer acme")
			resp, body := roundtriptest.Send(t, tr, req)
			if resp.StatusCode != http.StatusCreated || resp.Header.Get(claimclient.HeaderReplayed) != "true" {
				t.Fatalf("status %d replayed=%q body %s; want the replay of the committed order", resp.StatusCode, resp.Header.Get(claimclient.HeaderReplayed), body)
			}
			if n := f.rows("acme"); n != 1 {
				t.Fatalf("orders = %d, want exactly 1", n)
			}
			// Two round trips through the base: the retry was the
			// transport's, not one http.Transport made on its own.
			if d.requests.Load() != 2 || base.calls.Load() != 2 {
				t.Fatalf("server saw %d requests, base %d round trips; want the first and the transport's one retry", d.requests.Load(), base.calls.Load())
			}
		})
	}
}

// In workflow mode a 503 after the handler started is stored as failed and
// replayed. The transport retries the first answer (not a replay: the
// handler's own), gets the replay, and stops there: a stored answer is
// final for its key, and more attempts would only spend the retry budget.
func TestTransport_StopsAtAReplayedFailure(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	base := &countingBase{next: &http.Transport{}}
	defer base.next.CloseIdleConnections()
	tr, err := claimclient.NewTransport(base, claimclient.WithMaxAttempts(4), claimclient.WithBaseDelay(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	req := roundtriptest.Post(t, srv.URL+"/orders", `{"item":"book","status":503}`)
	req.Header.Set("Authorization", "Bearer acme")
	resp, body := roundtriptest.Send(t, tr, req)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(claimclient.HeaderReplayed) != "true" {
		t.Fatalf("status %d replayed=%q body %s; want the replayed 503", resp.StatusCode, resp.Header.Get(claimclient.HeaderReplayed), body)
	}
	if base.calls.Load() != 2 || f.runs.Load() != 1 {
		t.Fatalf("%d round trips, %d handler runs; want 2 (the answer, then its replay) and 1", base.calls.Load(), f.runs.Load())
	}
}

// countingBase counts the round trips a Transport makes through it.
type countingBase struct {
	next  *http.Transport
	calls atomic.Int64
}

func (c *countingBase) RoundTrip(r *http.Request) (*http.Response, error) {
	c.calls.Add(1)
	return c.next.RoundTrip(r)
}

// Fifty clients send the same request at once; each has its own Transport
// (a fleet), which retries in-progress answers. Exactly one order exists
// and every client ends with the same body.
func TestMiddleware_ConcurrentIdenticalRequests(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{redis: true, tx: mode.tx})
			// Count in-progress answers, and hold the first execution until
			// some duplicates were turned away (bounded, in case none are).
			var conflicts atomic.Int64
			enough := make(chan struct{})
			var once sync.Once
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				cw := &statusWriter{ResponseWriter: w}
				f.h.ServeHTTP(cw, r)
				if cw.status == http.StatusConflict && conflicts.Add(1) >= 5 {
					once.Do(func() { close(enough) })
				}
			}))
			defer srv.Close()
			f.hook(func(n int64, r *http.Request) {
				if n == 1 {
					select {
					case <-enough:
					case <-time.After(5 * time.Second):
					}
				}
			})
			base := &http.Transport{MaxIdleConnsPerHost: 64}
			defer base.CloseIdleConnections()

			const clients = 50
			bodies := make([]string, clients)
			statuses := make([]int, clients)
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					tr, err := claimclient.NewTransport(base, claimclient.WithMaxAttempts(10))
					if err != nil {
						t.Error(err)
						return
					}
					req := roundtriptest.Post(t, srv.URL+"/orders", `{"item":"book"}`)
					req.Header.Set("Authorization", "Bearer acme")
					req.Header.Set("Idempotency-Key", `"same-for-all-fifty"`)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Error(err)
						return
					}
					defer resp.Body.Close()
					statuses[i], bodies[i] = resp.StatusCode, roundtriptest.ReadAll(t, resp.Body)
				})
			}
			wg.Wait()
			if n := f.rows("acme"); n != 1 {
				t.Fatalf("orders = %d, want exactly 1", n)
			}
			for i := range clients {
				if statuses[i] != http.StatusCreated || bodies[i] != bodies[0] {
					t.Fatalf("client %d: %d %q; client 0: %d %q", i, statuses[i], bodies[i], statuses[0], bodies[0])
				}
			}
			if f.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", f.runs.Load())
			}
			t.Logf("in-progress answers retried: %d", conflicts.Load())
		})
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

// dropConnection closes the client's connection without a response.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}
