package main

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekey/oncekey/examples/internal/apptest"
	"github.com/oncekey/oncekey/examples/internal/backend"
)

func TestMain(m *testing.M) {
	// After a failed dial go-redis probes the server from a goroutine of
	// its own, which sees the client closed at its next probe, up to a
	// second after Close (the tests with Redis at a closed port).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// forEachBackend runs test as a parallel subtest on each backend: the
// embedded default, and the real servers found by testenv.
func forEachBackend(t *testing.T, test func(t *testing.T, f *fixture)) {
	apptest.ForEachFixture(t, "orders", setup, test)
}

// fixture is the service on one backend behind an httptest server, with
// the demo's cutter in front (disarmed unless a test arms it).
type fixture struct {
	*apptest.Client[Order]
	t   *testing.T
	b   *backend.Backend
	cut *cutter
}

func setup(t *testing.T, cfg backend.Config) *fixture {
	t.Helper()
	b := apptest.Open(t, cfg)
	a, err := newService(t.Context(), b, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cut := &cutter{next: a.handler}
	return &fixture{Client: apptest.Serve[Order](t, cut), t: t, b: b, cut: cut}
}

// response is one answer, read in full.
type response = apptest.Response[Order]

// post sends POST /orders through rt (the fixture's plain client when
// nil). tenant "" sends no credential, key "" no key.
func (f *fixture) post(rt http.RoundTripper, tenant, key, body string) response {
	f.t.Helper()
	return f.Post(rt, "/orders", tenant, key, body)
}

func (f *fixture) get(tenant, path string) response {
	f.t.Helper()
	return f.Get(tenant, path)
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
	apptest.WantStatus(t, what, r, status, problemType)
}

// emptyEnv is an environment with nothing set.
var emptyEnv = apptest.EmptyEnv
