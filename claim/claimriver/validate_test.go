package claimriver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
)

// errIncomplete is the test application's validation error.
var errIncomplete = errors.New("service and version are required")

// validDeploy is a WithValidate function as an application writes it: a
// body without its fields is refused (400, the error's message as the
// detail), an unknown service with the application's own 422 answer.
func validDeploy(r *http.Request, body []byte) error {
	again, err := io.ReadAll(r.Body)
	if err != nil || string(again) != string(body) {
		return errors.New("the request body does not read the same bytes again")
	}
	var in struct{ Service, Version string }
	if err := json.Unmarshal(body, &in); err != nil || in.Service == "" || in.Version == "" {
		return errIncomplete
	}
	if in.Service == "unknown" {
		return claim.Reject(durable.Result{StatusCode: http.StatusUnprocessableEntity,
			Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"error":"no such service"}`)})
	}
	return nil
}

// records counts the idempotency records of the test's schema.
func (e *env) records() int {
	var n int
	if err := e.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.schema.Name+`.idempotency_requests`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func decodeProblem(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var p map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	return p
}

// A request WithValidate refuses gets its 4xx at once and reserves
// nothing (no record, no job, no work); the corrected request with the
// same key then runs. Without the check the first request would answer
// 202 and its key would replay the work's 400 for ever.
func TestHandler_ValidateRefusesBeforeTheClaim(t *testing.T) {
	t.Parallel()
	e := setup(t, 2*time.Second, WithValidate(validDeploy))
	cl := e.client(true)
	h := e.handler(cl)
	w := post(h, "acme", "dep-v", `{"service":"api"}`)
	if w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != "application/problem+json" ||
		w.Header().Get("Cache-Control") != "no-store" || w.Header().Get(claimclient.HeaderRetention) != "86400" {
		t.Fatalf("invalid body = %d %v %s; want a 400 problem, no-store, Idempotency-Retention", w.Code, w.Header(), w.Body)
	}
	if p := decodeProblem(t, w); p["type"] != claimclient.ProblemBodyInvalid || p["title"] != "Request body invalid" ||
		p["status"] != float64(400) || p["detail"] != errIncomplete.Error() {
		t.Fatalf("problem = %v", p)
	}
	w = post(h, "acme", "dep-v", `{"service":"unknown","version":"1"}`)
	if w.Code != http.StatusUnprocessableEntity || w.Body.String() != `{"error":"no such service"}` ||
		w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("claim.Reject refusal = %d %v %s; want its own 422", w.Code, w.Header(), w.Body)
	}
	if r, j, c := e.records(), e.jobs(), e.calls.Load(); r != 0 || j != 0 || c != 0 {
		t.Fatalf("after refusals: %d records, %d jobs, %d calls; want none", r, j, c)
	}
	const body = `{"service":"api","version":"1.2.3"}`
	first := post(h, "acme", "dep-v", body)
	if first.Code != http.StatusAccepted {
		t.Fatalf("corrected body with the same key = %d %s; want 202", first.Code, first.Body)
	}
	id := strings.TrimPrefix(first.Header().Get("Location"), "/operations/")
	e.waitState("acme", id, durable.Completed)
	if rep := post(h, "acme", "dep-v", body); rep.Code != http.StatusCreated || rep.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d %s; want the stored 201", rep.Code, rep.Body)
	}
	if n := e.calls.Load(); n != 1 {
		t.Fatalf("%d work calls; want 1", n)
	}
}

func TestWithValidate_Nil(t *testing.T) {
	if _, err := newConfig([]Option{WithValidate(nil)}); !errors.Is(err, ErrConfig) {
		t.Fatalf("WithValidate(nil): %v; want ErrConfig", err)
	}
}

// The handler's problems are claimhttp's, cause by cause: the same status,
// type, title, detail, Content-Type, Cache-Control and
// Idempotency-Retention.
func TestHandler_ProblemsAreClaimhttps(t *testing.T) {
	t.Parallel()
	e := setup(t, 2*time.Second)
	riverH, err := e.runner.Handler(e.client(false), "POST /deploys", tenantOf)
	if err != nil {
		t.Fatal(err)
	}
	guard, err := claimhttp.Middleware(e.c, tenantOf)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /deploys", guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	big := `{"x":"` + strings.Repeat("a", 2<<20) + `"}`
	send := func(h http.Handler, adapter string, mod func(*http.Request), body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/deploys", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("Idempotency-Key", `"`+adapter+`-key"`)
		if mod != nil {
			mod(r)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, adapter := range []string{"http", "river"} { // the key of the reused-key case
		h := http.Handler(mux)
		if adapter == "river" {
			h = riverH
		}
		if w := send(h, adapter, nil, `{"v":1}`); w.Code/100 != 2 {
			t.Fatalf("%s: first request = %d", adapter, w.Code)
		}
	}
	for _, c := range []struct {
		name string
		mod  func(*http.Request)
		body string
		want int
	}{
		{"key missing", func(r *http.Request) { r.Header.Del("Idempotency-Key") }, `{"v":1}`, 400},
		{"key invalid", func(r *http.Request) { r.Header.Set("Idempotency-Key", `"a", "b"`) }, `{"v":1}`, 400},
		{"no tenant", func(r *http.Request) { r.Header.Del("X-Tenant") }, `{"v":1}`, 401},
		{"body invalid", func(r *http.Request) { r.Header.Set("Idempotency-Key", `"new-key"`) }, `{"v":`, 400},
		{"body too large", func(r *http.Request) { r.Header.Set("Idempotency-Key", `"new-key"`) }, big, 413},
		{"key reused", nil, `{"v":2}`, 422},
	} {
		t.Run(c.name, func(t *testing.T) {
			hw, rw := send(mux, "http", c.mod, c.body), send(riverH, "river", c.mod, c.body)
			if hw.Code != c.want || rw.Code != c.want {
				t.Fatalf("claimhttp %d, claimriver %d; want %d (%s | %s)", hw.Code, rw.Code, c.want, hw.Body, rw.Body)
			}
			for _, k := range []string{"Content-Type", "Cache-Control", claimclient.HeaderRetention, "Retry-After"} {
				if hv, rv := hw.Header().Get(k), rw.Header().Get(k); hv != rv {
					t.Errorf("%s: claimhttp %q, claimriver %q", k, hv, rv)
				}
			}
			hp, rp := decodeProblem(t, hw), decodeProblem(t, rw)
			if !reflect.DeepEqual(hp, rp) || rp["detail"] == nil {
				t.Errorf("problems differ:\nclaimhttp  %v\nclaimriver %v", hp, rp)
			}
		})
	}
}
