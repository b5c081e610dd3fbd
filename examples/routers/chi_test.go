package routers

import (
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/examples/internal/apptest"
)

// claimer returns a Claimer on the examples' embedded store, a SQLite file
// removed when the test ends, without Redis: these tests are about routes.
func claimer(t *testing.T) *claim.Claimer[*sql.Tx] {
	t.Helper()
	b := apptest.Open(t, apptest.Embedded(t, "routers"))
	c, err := claim.New(b.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func tenant(*http.Request) (string, error) { return "acme", nil }

// chiOperation names a chi route by its pattern. The middleware must sit on
// the route (r.With(guard)), where the pattern is complete.
func chiOperation(r *http.Request) string {
	return r.Method + " " + chi.RouteContext(r.Context()).RoutePattern()
}

func post(t *testing.T, srv *httptest.Server, path, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// Under chi, with WithOperation from the route pattern, every account's
// charges are one operation: the same key replays on the same resource and
// is refused (422) with another one, instead of running once per path.
func TestChi_OperationIsTheRoutePattern(t *testing.T) {
	c := claimer(t)
	var ran atomic.Int64
	guard, err := claimhttp.Middleware(c, tenant, claimhttp.WithOperation(chiOperation))
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.With(guard).Post("/accounts/{id}/charges", func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"charged":"` + chi.URLParam(r, "id") + `"}`))
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	if resp := post(t, srv, "/accounts/1/charges", "k-1", `{"amount":5}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("first = %d, want 201", resp.StatusCode)
	}
	if resp := post(t, srv, "/accounts/1/charges", "k-1", `{"amount":5}`); resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d replayed=%q, want the stored 201", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if resp := post(t, srv, "/accounts/2/charges", "k-1", `{"amount":5}`); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("same key on another account = %d, want 422 (one operation, another request)", resp.StatusCode)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// Without WithOperation the middleware names the operation only from
// r.Pattern. Where the router leaves it empty the request is refused (500)
// before anything is reserved: a raw path would make every resource id its
// own operation. Where the router fills it (chi's own, if it does), that
// pattern is used and the key works as above.
func TestChi_DefaultNamingNeverUsesTheRawPath(t *testing.T) {
	c := claimer(t)
	var ran atomic.Int64
	guard, err := claimhttp.Middleware(c, tenant)
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	var pattern atomic.Value
	r.With(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pattern.Store(r.Pattern)
			next.ServeHTTP(w, r)
		})
	}, guard).Post("/accounts/{id}/charges", func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	first := post(t, srv, "/accounts/1/charges", "k-2", `{"amount":5}`)
	other := post(t, srv, "/accounts/2/charges", "k-2", `{"amount":5}`)
	p, _ := pattern.Load().(string)
	t.Logf("chi set r.Pattern = %q", p)
	switch {
	case p == "":
		if first.StatusCode != http.StatusInternalServerError || other.StatusCode != http.StatusInternalServerError || ran.Load() != 0 {
			t.Fatalf("no r.Pattern: got %d, %d with %d runs; want 500, 500 and no run", first.StatusCode, other.StatusCode, ran.Load())
		}
	case strings.Contains(p, "{id}"):
		if first.StatusCode != http.StatusCreated || other.StatusCode != http.StatusUnprocessableEntity || ran.Load() != 1 {
			t.Fatalf("r.Pattern %q: got %d, %d with %d runs; want 201, 422 and one run", p, first.StatusCode, other.StatusCode, ran.Load())
		}
	default:
		t.Fatalf("chi set r.Pattern to %q, not a route pattern", p)
	}
}

// The operation resource mounts on chi as on any router: the Location of an
// uncertain (or, with claim.WithPoll, in-progress) answer is served under
// chi's route pattern; another tenant gets 404.
func TestChi_OperationsHandler(t *testing.T) {
	c := claimer(t)
	ops, err := claimhttp.Operations(c, func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil })
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Get("/operations/{id}", ops.ServeHTTP)
	srv := httptest.NewServer(r)
	defer srv.Close()

	out, err := c.Claim(t.Context(), claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /deploys", Key: "k-op"}, Fingerprint: "v1:x"})
	if err != nil || out.Kind != claim.Acquired {
		t.Fatalf("claim: %v %v", out.Kind, err)
	}
	if err := out.Lease.Complete(t.Context(), durable.Result{StatusCode: 201, Headers: map[string][]string{"Location": {"/deploys/d1"}}, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	get := func(tenant string) (*http.Response, string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/operations/"+out.OperationID, nil)
		req.Header.Set("X-Tenant", tenant)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("acme")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"state":"completed"`) || !strings.Contains(body, `"location":"/deploys/d1"`) {
		t.Fatalf("acme: %d %s", resp.StatusCode, body)
	}
	if resp, body := get("globex"); resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("globex: %d %s", resp.StatusCode, body)
	}
}
