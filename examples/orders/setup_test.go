package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestMain(m *testing.M) {
	// After a failed dial go-redis probes the server from a goroutine of
	// its own, which sees the client closed at its next probe, up to a
	// second after Close (the tests with Redis at a closed port).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// testRedisTimeout is the Redis budget in tests. Under -race on a busy
// machine the in-process Redis runs its scripts many times slower than
// usual; a timed-out Redis step leaves its lease in place, and duplicates
// are told "in progress" until it expires, which would make the tests slow
// (correctness does not depend on Redis either way).
const testRedisTimeout = 5 * time.Second

// backends are the two configurations every end-to-end test runs on: the
// embedded default, and the real servers found by testenv (with CI=true a
// missing server fails the test).
var backends = []struct {
	name   string
	config func(t *testing.T) backend.Config
}{
	{"Embedded", func(t *testing.T) backend.Config {
		return backend.Config{Name: "orders", DataDir: t.TempDir(), RedisTimeout: testRedisTimeout}
	}},
	{"PostgresRedis", realServers},
}

// realServers names a fresh PostgreSQL schema and a fresh Redis key
// prefix, both removed when the test ends.
func realServers(t *testing.T) backend.Config {
	s := testenv.Postgres(t)
	_, prefix := testenv.Redis(t)
	return backend.Config{Name: "orders", DatabaseURL: s.URL, RedisURL: testenv.RedisURL(t), RedisPrefix: prefix, RedisTimeout: testRedisTimeout}
}

// forEachBackend runs test as a parallel subtest on each backend.
func forEachBackend(t *testing.T, test func(t *testing.T, f *fixture)) {
	t.Parallel()
	for _, bc := range backends {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			test(t, setup(t, bc.config(t)))
		})
	}
}

// fixture is the service on one backend behind an httptest server, with
// the demo's cutter in front (disarmed unless a test arms it).
type fixture struct {
	t      *testing.T
	b      *backend.Backend
	url    string
	cut    *cutter
	client *http.Client // plain: retries nothing
	base   *http.Transport
}

func setup(t *testing.T, cfg backend.Config) *fixture {
	t.Helper()
	b, err := backend.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	a, err := newService(t.Context(), b, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cut := &cutter{next: a.handler}
	srv := httptest.NewServer(cut)
	t.Cleanup(srv.Close)
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(base.CloseIdleConnections)
	return &fixture{t: t, b: b, url: srv.URL, cut: cut, base: base, client: &http.Client{Transport: base, Timeout: 30 * time.Second}}
}

// response is one answer, read in full.
type response struct {
	status  int
	header  http.Header
	body    string
	problem problemDoc
	order   Order
}

func (r response) replayed() bool { return r.header.Get(claimclient.HeaderReplayed) == "true" }

// post sends POST /orders through rt (the fixture's plain client when
// nil). tenant "" sends no credential, key "" no key.
func (f *fixture) post(rt http.RoundTripper, tenant, key, body string) response {
	f.t.Helper()
	req, err := http.NewRequestWithContext(f.t.Context(), http.MethodPost, f.url+"/orders", strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer "+tenant)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", strconv.Quote(key)) // the draft's sf-string form
	}
	return f.do(rt, req)
}

func (f *fixture) get(tenant, path string) response {
	f.t.Helper()
	req, err := http.NewRequestWithContext(f.t.Context(), http.MethodGet, f.url+path, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tenant)
	return f.do(nil, req)
}

func (f *fixture) do(rt http.RoundTripper, req *http.Request) response {
	c := f.client
	if rt != nil {
		c = &http.Client{Transport: rt, Timeout: 60 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		f.t.Errorf("%s %s: %v", req.Method, req.URL.Path, err)
		return response{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Errorf("read body: %v", err)
	}
	r := response{status: resp.StatusCode, header: resp.Header, body: string(b)}
	switch mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt {
	case problemContentType:
		if err := json.Unmarshal(b, &r.problem); err != nil {
			f.t.Errorf("problem %s: %v", b, err)
		}
	case "application/json":
		_ = json.Unmarshal(b, &r.order)
	}
	return r
}

// transport returns a retrying client transport over the fixture's
// connections, with its own retry budget.
func (f *fixture) transport(opts ...claimclient.Option) *claimclient.Transport {
	f.t.Helper()
	tr, err := claimclient.NewTransport(f.base, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return tr
}

// orders counts the tenant's order rows in the database, independently of
// the service's own queries.
func (f *fixture) orders(tenant string) int {
	f.t.Helper()
	ctx := context.WithoutCancel(f.t.Context())
	const q = `SELECT count(*) FROM example_orders WHERE tenant = `
	var n int
	var err error
	if f.b.Postgres != nil {
		err = f.b.Pool.QueryRow(ctx, q+`$1`, tenant).Scan(&n)
	} else {
		err = f.b.DB.QueryRowContext(ctx, q+`?`, tenant).Scan(&n)
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

func wantStatus(t *testing.T, what string, r response, status int, problemType string) {
	t.Helper()
	if r.status != status || r.problem.Type != problemType {
		t.Fatalf("%s: %d %q %s; want %d %q", what, r.status, r.problem.Type, r.body, status, problemType)
	}
}

// emptyEnv is an environment with nothing set.
func emptyEnv(string) string { return "" }
