package main

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/examples/internal/apptest"
	"github.com/oncekey/oncekey/examples/internal/backend"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testGatewayTimeout is how long the service waits for the gateway in
// tests: the timeout modes' tests wait it out, and a loaded CI machine
// must not turn the fake gateway's normal answer into a timeout (200ms
// made fifty concurrent duplicates end uncertain once in CI).
const testGatewayTimeout = 2 * time.Second

// forEachBackend runs test as a parallel subtest on each backend: the
// embedded default, and the real servers found by testenv.
func forEachBackend(t *testing.T, test func(t *testing.T, f *fixture)) {
	apptest.ForEachFixture(t, "payments", setup, test)
}

// fixture is the service on one backend behind an httptest server, with
// its own fake gateway. Its reconciler does not run on its own: tests call
// app.reconcileOnce.
type fixture struct {
	*apptest.Client[Payment]
	t   *testing.T
	gw  *gateway
	app *app
}

func setup(t *testing.T, cfg backend.Config) *fixture {
	t.Helper()
	b := apptest.Open(t, cfg)
	gw, err := startGateway()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.close)
	a, err := newService(b, newGatewayClient(gw.url, testGatewayTimeout), slog.New(slog.DiscardHandler), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{Client: apptest.Serve[Payment](t, a.handler), t: t, gw: gw, app: a}
}

// response is one answer, read in full.
type response = apptest.Response[Payment]

// post sends POST /payments through rt (the fixture's plain client when
// nil).
func (f *fixture) post(rt http.RoundTripper, tenant, key, body string) response {
	f.t.Helper()
	return f.Post(rt, "/payments", tenant, key, body)
}

// postTimedOut posts pay with key while the gateway is in mode, one of
// its timeout modes (then back to normal), and fails t unless the answer
// is 202 uncertain.
func (f *fixture) postTimedOut(t *testing.T, mode gatewayMode, key string) response {
	t.Helper()
	f.gw.setMode(mode)
	r := f.post(nil, "acme", key, pay)
	f.gw.setMode(modeNormal)
	wantStatus(t, "gateway timeout", r, http.StatusAccepted, claimclient.ProblemUncertain)
	return r
}

func wantStatus(t *testing.T, what string, r response, status int, problemType string) {
	t.Helper()
	apptest.WantStatus(t, what, r, status, problemType)
}

var emptyEnv = apptest.EmptyEnv
