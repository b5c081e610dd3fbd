package claimclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/durable/driver/wire"
	"github.com/oncekey/oncekey/internal/roundtriptest"
)

// fakeClock is the injected clock and sleep: Sleep records each duration
// and advances the clock by it, so no test waits.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newFakeClock() *fakeClock {
	// An hour ahead of the real clock, so a context deadline built from it
	// never expires in real time while the test runs.
	return &fakeClock{now: time.Now().Add(time.Hour).Truncate(time.Second)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

func (c *fakeClock) take() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sleeps
	c.sleeps = nil
	return s
}

// stub is a server answering with respond, recording what it received.
type stub struct {
	srv      *httptest.Server
	attempts atomic.Int64
	mu       sync.Mutex
	keys     []string
	bodies   []string
}

func newStub(t *testing.T, respond func(n int64, w http.ResponseWriter, r *http.Request)) *stub {
	t.Helper()
	s := &stub{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.attempts.Add(1)
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.keys = append(s.keys, strings.Join(r.Header.Values("Idempotency-Key"), "|"))
		s.bodies = append(s.bodies, string(body))
		s.mu.Unlock()
		respond(n, w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// newTransport returns a transport on clk (the real clock when nil), with
// c's Jitter and Sleep when set; without WithBudget it gets a budget of its
// own on clk.
func newTransport(t *testing.T, clk *fakeClock, opts []claimclient.Option, c ...claimclient.Clock) *claimclient.Transport {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	var hooks claimclient.Clock
	if len(c) > 0 {
		hooks = c[0]
	}
	if clk != nil {
		hooks.Now = clk.Now
		if hooks.Sleep == nil {
			hooks.Sleep = clk.Sleep
		}
	}
	tr, err := claimclient.NewTransportWithClock(base, hooks, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func unavailable(w http.ResponseWriter, retryAfter string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	http.Error(w, "down", http.StatusServiceUnavailable)
}

// Against a server answering 503 to everything, the transport retries at
// most Floor + Ratio × requests over the window, and each sleep lies within
// the full-jitter bounds of its retry.
func TestTransport_503sStayWithinBudgetAndBackoff(t *testing.T) {
	t.Parallel()
	s := newStub(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { unavailable(w, "") })
	clk := newFakeClock()
	budget, err := claimclient.NewRetryBudgetWithClock(clk.Now, claimclient.WithRatio(0.1), claimclient.WithFloor(10), claimclient.WithWindow(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	const base, maxDelay = 100 * time.Millisecond, 300 * time.Millisecond
	tr := newTransport(t, clk, []claimclient.Option{claimclient.WithMaxAttempts(4), claimclient.WithBaseDelay(base), claimclient.WithMaxDelay(maxDelay), claimclient.WithBudget(budget)})

	const requests = 200
	retries := 0
	for range requests {
		resp, _ := roundtriptest.Send(t, tr, roundtriptest.Post(t, s.srv.URL, `{"n":1}`))
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("status = %d", resp.StatusCode)
		}
		sleeps := clk.take()
		if len(sleeps) > 3 {
			t.Fatalf("%d sleeps for one request, MaxAttempts is 4", len(sleeps))
		}
		for i, d := range sleeps {
			ceiling := min(maxDelay, base<<i)
			if d < 0 || d >= ceiling {
				t.Fatalf("sleep before retry %d = %v, want in [0, %v)", i+1, d, ceiling)
			}
		}
		retries += len(sleeps)
	}
	budgetMax := 10 + requests/10
	if retries != budgetMax {
		t.Fatalf("retries = %d, want the budget's %d (10 + 10%% of %d)", retries, budgetMax, requests)
	}
	if got := int(s.attempts.Load()); got != requests+retries {
		t.Fatalf("server saw %d attempts, want %d", got, requests+retries)
	}
	if got := float64(s.attempts.Load()) / requests; got > 1.16 {
		t.Fatalf("load amplification %.2f", got)
	}
}

func TestTransport_HonoursRetryAfter(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	for name, tc := range map[string]struct {
		header string
		want   time.Duration
	}{
		"Seconds":  {"2", 2 * time.Second},
		"HTTPDate": {clk.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat), 3 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clk := &fakeClock{now: clk.Now()}
			s := newStub(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					unavailable(w, tc.header)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			tr := newTransport(t, clk, []claimclient.Option{claimclient.WithBaseDelay(100 * time.Millisecond)})
			if resp, _ := roundtriptest.Send(t, tr, roundtriptest.Post(t, s.srv.URL, "x")); resp.StatusCode != http.StatusCreated {
				t.Fatalf("status = %d", resp.StatusCode)
			}
			sleeps := clk.take()
			if len(sleeps) != 1 || sleeps[0] < tc.want || sleeps[0] >= tc.want+100*time.Millisecond {
				t.Fatalf("sleeps = %v, want one in [%v, %v)", sleeps, tc.want, tc.want+100*time.Millisecond)
			}
		})
	}

	t.Run("TooLongIsReturned", func(t *testing.T) {
		t.Parallel()
		clk := newFakeClock()
		s := newStub(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { unavailable(w, "3600") })
		tr := newTransport(t, clk, []claimclient.Option{claimclient.WithMaxRetryAfter(time.Minute)})
		if resp, _ := roundtriptest.Send(t, tr, roundtriptest.Post(t, s.srv.URL, "x")); resp.StatusCode != http.StatusServiceUnavailable || s.attempts.Load() != 1 || len(clk.take()) != 0 {
			t.Fatalf("status %d after %d attempts", resp.StatusCode, s.attempts.Load())
		}
	})
}

func TestTransport_NeverSleepsPastTheDeadline(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	s := newStub(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { unavailable(w, "") })
	maxJitter := func(n time.Duration) time.Duration { return n - 1 } // the upper bound, deterministically
	tr := newTransport(t, clk, []claimclient.Option{claimclient.WithMaxAttempts(10), claimclient.WithBaseDelay(100 * time.Millisecond)}, claimclient.Clock{Jitter: maxJitter})
	deadline := clk.Now().Add(250 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, _ := roundtriptest.Send(t, tr, roundtriptest.Post(t, s.srv.URL, "x").WithContext(ctx))
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status = %d", resp.StatusCode)
	}
	// 100ms-1ns fits before the deadline; the next, 200ms-1ns, would not.
	sleeps := clk.take()
	if len(sleeps) != 1 || s.attempts.Load() != 2 {
		t.Fatalf("sleeps %v, attempts %d; want 1 sleep, 2 attempts", sleeps, s.attempts.Load())
	}
	if !clk.Now().Before(deadline) {
		t.Fatalf("clock %v reached the deadline %v", clk.Now(), deadline)
	}
}

func TestTransport_CancelDuringSleepReturnsTheCause(t *testing.T) {
	t.Parallel()
	s := newStub(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { unavailable(w, "") })
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("caller gave up")
	tr := newTransport(t, nil, nil, claimclient.Clock{Sleep: func(ctx context.Context, d time.Duration) error {
		cancel(cause)
		<-ctx.Done()
		return context.Cause(ctx)
	}})
	_, err := tr.RoundTrip(roundtriptest.Post(t, s.srv.URL, "x").WithContext(ctx))
	if !errors.Is(err, cause) {
		t.Fatalf("err = %v, want the cancel cause", err)
	}
}

func TestTransport_WhatIsRetried(t *testing.T) {
	t.Parallel()
	replayed := func(status int) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			w.Header().Set(claimclient.HeaderReplayed, "true")
			w.WriteHeader(status)
		}
	}
	inProgress := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"type":%q,"title":"Request in progress","status":409}`, claimclient.ProblemInProgress)
	}
	for name, tc := range map[string]struct {
		first func(w http.ResponseWriter)
		retry bool
	}{
		"500":           {func(w http.ResponseWriter) { w.WriteHeader(500) }, true},
		"502":           {func(w http.ResponseWriter) { w.WriteHeader(502) }, true},
		"503":           {func(w http.ResponseWriter) { w.WriteHeader(503) }, true},
		"504":           {func(w http.ResponseWriter) { w.WriteHeader(504) }, true},
		"429":           {func(w http.ResponseWriter) { w.WriteHeader(429) }, true},
		"409InProgress": {inProgress, true},
		"501":           {func(w http.ResponseWriter) { w.WriteHeader(501) }, false},
		"400":           {func(w http.ResponseWriter) { w.WriteHeader(400) }, false},
		"422":           {func(w http.ResponseWriter) { w.WriteHeader(422) }, false},
		"404":           {func(w http.ResponseWriter) { w.WriteHeader(404) }, false},
		"409Plain":      {func(w http.ResponseWriter) { http.Error(w, "conflict", http.StatusConflict) }, false},
		"409OtherProblem": {func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(409)
			fmt.Fprint(w, `{"type":"https://example.com/other"}`)
		}, false},
		"422KeyReused": {func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(422)
			fmt.Fprintf(w, `{"type":%q}`, claimclient.ProblemKeyReused)
		}, false},
		// A replay is the stored answer for the key: final, whatever its
		// status. Retrying it cannot change it and only spends budget.
		"503Replayed":  {replayed(503), false},
		"500Replayed":  {replayed(500), false},
		"429Replayed":  {replayed(429), false},
		"409Replayed":  {func(w http.ResponseWriter) { w.Header().Set(claimclient.HeaderReplayed, "true"); inProgress(w) }, false},
		"201":          {func(w http.ResponseWriter) { w.WriteHeader(201) }, false},
		"202Uncertain": {func(w http.ResponseWriter) { w.WriteHeader(202) }, false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newStub(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					tc.first(w)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, "done")
			})
			clk := newFakeClock()
			resp, body := roundtriptest.Send(t, newTransport(t, clk, nil), roundtriptest.Post(t, s.srv.URL, "payload"))
			retried := s.attempts.Load() == 2
			if retried != tc.retry {
				t.Fatalf("attempts = %d, want retry=%v", s.attempts.Load(), tc.retry)
			}
			if tc.retry && (resp.StatusCode != http.StatusCreated || body != "done") {
				t.Fatalf("after retry: %d %q", resp.StatusCode, body)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			for i, b := range s.bodies {
				if b != "payload" {
					t.Fatalf("attempt %d sent body %q: not rewound", i+1, b)
				}
			}
		})
	}
}

func TestTransport_InspectedProblemStaysReadable(t *testing.T) {
	t.Parallel()
	const problem = `{"type":"https://example.com/other","detail":"keep me"}`
	s := newStub(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, problem)
	})
	if _, body := roundtriptest.Send(t, newTransport(t, newFakeClock(), nil), roundtriptest.Post(t, s.srv.URL, "x")); body != problem {
		t.Fatalf("body = %q, want %q", body, problem)
	}
}

func TestTransport_Keys(t *testing.T) {
	t.Parallel()
	s := newStub(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
		if n%2 == 1 {
			unavailable(w, "")
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	tr := newTransport(t, newFakeClock(), nil)

	t.Run("AddedQuotedAndKeptAcrossRetries", func(t *testing.T) {
		for range 2 {
			req := roundtriptest.Post(t, s.srv.URL, "x")
			roundtriptest.Send(t, tr, req)
			if req.Header.Get("Idempotency-Key") != "" {
				t.Fatal("the caller's request was modified")
			}
		}
		s.mu.Lock()
		keys := append([]string(nil), s.keys...)
		s.keys = nil
		s.mu.Unlock()
		if len(keys) != 4 || keys[0] != keys[1] || keys[2] != keys[3] || keys[0] == keys[2] {
			t.Fatalf("keys = %q; want one fresh key per request, kept across its retry", keys)
		}
		for _, k := range keys {
			parsed, err := wire.ParseKey(http.Header{"Idempotency-Key": {k}}, "")
			if !strings.HasPrefix(k, `"`) || err != nil || len(parsed) != 32 {
				t.Fatalf("key %q (parsed %q, %v): want a quoted 128-bit key", k, parsed, err)
			}
		}
	})

	t.Run("CallersKeyIsKept", func(t *testing.T) {
		req := roundtriptest.Post(t, s.srv.URL, "x")
		req.Header.Set("Idempotency-Key", "stripe-style-key")
		roundtriptest.Send(t, tr, req)
		s.mu.Lock()
		keys := append([]string(nil), s.keys...)
		s.keys = nil
		s.mu.Unlock()
		if len(keys) != 2 || keys[0] != "stripe-style-key" || keys[1] != "stripe-style-key" {
			t.Fatalf("keys = %q", keys)
		}
	})

	t.Run("SafeMethodsGetNone", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, s.srv.URL, nil)
		roundtriptest.Send(t, tr, req)
		s.mu.Lock()
		keys := append([]string(nil), s.keys...)
		s.keys = nil
		s.mu.Unlock()
		if len(keys) != 2 || keys[0] != "" || keys[1] != "" {
			t.Fatalf("GET keys = %q", keys)
		}
	})
}

func TestTransport_UnrewindableBodyIsSentOnce(t *testing.T) {
	t.Parallel()
	s := newStub(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { unavailable(w, "") })
	req := roundtriptest.Post(t, s.srv.URL, "x")
	req.Body, req.GetBody = io.NopCloser(strings.NewReader("x")), nil
	resp, _ := roundtriptest.Send(t, newTransport(t, newFakeClock(), nil), req)
	if resp.StatusCode != http.StatusServiceUnavailable || s.attempts.Load() != 1 {
		t.Fatalf("status %d, attempts %d; want one attempt", resp.StatusCode, s.attempts.Load())
	}
}

// A server that drops the connection without answering: the transport
// retries with the same key.
func TestTransport_RetriesConnectionErrors(t *testing.T) {
	t.Parallel()
	s := newStub(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			dropConnection(w)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	clk := newFakeClock()
	resp, _ := roundtriptest.Send(t, newTransport(t, clk, nil), roundtriptest.Post(t, s.srv.URL, "x"))
	s.mu.Lock()
	defer s.mu.Unlock()
	if resp.StatusCode != http.StatusCreated || len(s.keys) != 2 || s.keys[0] != s.keys[1] || s.keys[0] == "" {
		t.Fatalf("status %d, keys %q", resp.StatusCode, s.keys)
	}
	if n := len(clk.take()); n != 1 {
		t.Fatalf("%d backoff sleeps, want 1: the retry was not the transport's", n)
	}
}

// dropConnection closes the client's connection without a response.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

func TestNewTransport_RejectsBadOptions(t *testing.T) {
	t.Parallel()
	for name, o := range map[string][]claimclient.Option{
		"WithHeader":        {claimclient.WithHeader("bad header")},
		"WithMaxAttempts":   {claimclient.WithMaxAttempts(-1)},
		"WithBaseDelay":     {claimclient.WithBaseDelay(-1)},
		"WithMaxDelay":      {claimclient.WithBaseDelay(time.Second), claimclient.WithMaxDelay(time.Millisecond)},
		"WithMaxRetryAfter": {claimclient.WithMaxRetryAfter(0)},
		"WithBudget":        {claimclient.WithBudget(nil)},
	} {
		if _, err := claimclient.NewTransport(nil, o...); !errors.Is(err, claimclient.ErrConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestRetryBudget(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	b, err := claimclient.NewRetryBudgetWithClock(clk.Now, claimclient.WithRatio(0.5), claimclient.WithFloor(2), claimclient.WithWindow(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	spend := func() int {
		n := 0
		for b.TryRetry() {
			n++
			if n > 1000 {
				t.Fatal("budget never ran out")
			}
		}
		return n
	}
	if n := spend(); n != 2 {
		t.Fatalf("no requests: %d retries, want the floor 2", n)
	}
	for range 10 {
		b.Request()
	}
	if n := spend(); n != 5 {
		t.Fatalf("after 10 requests: %d more retries, want 5 (2 + 0.5×10 - 2 spent)", n)
	}
	// The window slides: after it has passed, the old requests and
	// retries no longer count.
	_ = clk.Sleep(context.Background(), 11*time.Second)
	if n := spend(); n != 2 {
		t.Fatalf("after the window: %d retries, want the floor 2", n)
	}

	// A floor of 0 means none: with no requests, no retry.
	none, err := claimclient.NewRetryBudgetWithClock(clk.Now, claimclient.WithFloor(0))
	if err != nil {
		t.Fatal(err)
	}
	if none.TryRetry() {
		t.Fatal("floor 0: a retry without requests, want none")
	}
	for range 10 {
		none.Request()
	}
	if !none.TryRetry() || none.TryRetry() {
		t.Fatal("floor 0 after 10 requests: want exactly 1 retry (10% of 10)")
	}

	for name, o := range map[string]claimclient.BudgetOption{
		"WithRatio":  claimclient.WithRatio(1.5),
		"WithFloor":  claimclient.WithFloor(-1),
		"WithWindow": claimclient.WithWindow(time.Millisecond),
	} {
		if _, err := claimclient.NewRetryBudget(o); !errors.Is(err, claimclient.ErrConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The transport itself rewinds the body with GetBody for each retry (a
// base other than http.Transport does not do it for us).
func TestTransport_RewindsTheBodyWithGetBody(t *testing.T) {
	t.Parallel()
	var bodies []string
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		bodies = append(bodies, string(b))
		status := http.StatusServiceUnavailable
		if len(bodies) == 3 {
			status = http.StatusCreated
		}
		return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	})
	clk := newFakeClock()
	tr, err := claimclient.NewTransportWithClock(base, claimclient.Clock{Now: clk.Now, Sleep: clk.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	req := roundtriptest.Post(t, "http://example.invalid/orders", "payload")
	getBody := req.GetBody
	calls := 0
	req.GetBody = func() (io.ReadCloser, error) { calls++; return getBody() }
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("RoundTrip = %v, %v", resp, err)
	}
	if len(bodies) != 3 || bodies[0] != "payload" || bodies[1] != "payload" || bodies[2] != "payload" || calls != 2 {
		t.Fatalf("bodies %q, GetBody called %d times; want the payload three times, two rewinds", bodies, calls)
	}
}
func TestNewKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		k, err := claimclient.NewKey()
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
