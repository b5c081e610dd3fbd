package main

import (
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
	goleak.VerifyTestMain(m)
}

// testRedisTimeout is the Redis budget in tests. Under -race on a busy
// machine the in-process Redis runs its scripts many times slower than
// usual; a timed-out Redis step leaves its lease in place, and duplicates
// are told "in progress" until it expires, which would make the tests slow
// (correctness does not depend on Redis either way).
const testRedisTimeout = 5 * time.Second

// testGatewayTimeout is how long the service waits for the gateway in
// tests: the timeout modes' tests wait it out, and a loaded CI machine
// must not turn the fake gateway's normal answer into a timeout (200ms
// made fifty concurrent duplicates end uncertain once in CI).
const testGatewayTimeout = 2 * time.Second

// backends are the two configurations every end-to-end test runs on: the
// embedded default, and the real servers found by testenv (with CI=true a
// missing server fails the test).
var backends = []struct {
	name   string
	config func(t *testing.T) backend.Config
}{
	{"Embedded", func(t *testing.T) backend.Config {
		return backend.Config{Name: "payments", DataDir: t.TempDir(), RedisTimeout: testRedisTimeout}
	}},
	{"PostgresRedis", realServers},
}

// realServers names a fresh PostgreSQL schema and a fresh Redis key
// prefix, both removed when the test ends.
func realServers(t *testing.T) backend.Config {
	s := testenv.Postgres(t)
	_, prefix := testenv.Redis(t)
	return backend.Config{Name: "payments", DatabaseURL: s.URL, RedisURL: testenv.RedisURL(t), RedisPrefix: prefix, RedisTimeout: testRedisTimeout}
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
// its own fake gateway. Its reconciler does not run on its own: tests call
// app.reconcileOnce.
type fixture struct {
	t      *testing.T
	gw     *gateway
	app    *app
	url    string
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
	gw, err := startGateway()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.close)
	a, err := newService(b, newGatewayClient(gw.url, testGatewayTimeout), slog.New(slog.DiscardHandler), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.handler)
	t.Cleanup(srv.Close)
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(base.CloseIdleConnections)
	return &fixture{t: t, gw: gw, app: a, url: srv.URL, base: base, client: &http.Client{Transport: base, Timeout: 30 * time.Second}}
}

// response is one answer, read in full.
type response struct {
	status  int
	header  http.Header
	body    string
	problem problemDoc
	payment Payment
}

func (r response) replayed() bool { return r.header.Get(claimclient.HeaderReplayed) == "true" }

// post sends POST /payments through rt (the fixture's plain client when
// nil).
func (f *fixture) post(rt http.RoundTripper, tenant, key, body string) response {
	f.t.Helper()
	req, err := http.NewRequestWithContext(f.t.Context(), http.MethodPost, f.url+"/payments", strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tenant)
	req.Header.Set("Idempotency-Key", strconv.Quote(key)) // the draft's sf-string form
	c := f.client
	if rt != nil {
		c = &http.Client{Transport: rt, Timeout: 60 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		f.t.Errorf("POST /payments: %v", err)
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
		_ = json.Unmarshal(b, &r.payment)
	}
	return r
}

func (f *fixture) transport(opts ...claimclient.Option) *claimclient.Transport {
	f.t.Helper()
	tr, err := claimclient.NewTransport(f.base, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return tr
}

func wantStatus(t *testing.T, what string, r response, status int, problemType string) {
	t.Helper()
	if r.status != status || r.problem.Type != problemType {
		t.Fatalf("%s: %d %q %s; want %d %q", what, r.status, r.problem.Type, r.body, status, problemType)
	}
}

func emptyEnv(string) string { return "" }
