package claimhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
)

// opView is the operation JSON the handler serves.
type opView struct {
	ID         string     `json:"id"`
	State      string     `json:"state"`
	AcceptedAt time.Time  `json:"accepted_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Result     *struct {
		Status   int    `json:"status"`
		Location string `json:"location"`
	} `json:"result"`
	Step *struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"step"`
}

// withOperations serves f's routes and the operation resource under
// /operations/ on one net/http ServeMux.
func withOperations(t *testing.T, f *fixture) http.Handler {
	t.Helper()
	ops, err := claimhttp.Operations(f.c, tenantOf, claimhttp.WithRetryAfter(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /operations/", authenticate(ops))
	mux.Handle("/", f.h)
	return mux
}

func getOp(t *testing.T, h http.Handler, tenant, path string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	if tenant != "" {
		r.Header.Set("Authorization", "Bearer "+tenant)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if cc := w.Header().Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("GET %s: Cache-Control %q; want no-store", path, cc)
	}
	return w
}

func decodeOp(t *testing.T, w *httptest.ResponseRecorder) opView {
	t.Helper()
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("operation: %d %s %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	var v opView
	dec := json.NewDecoder(strings.NewReader(w.Body.String()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("operation body %s: %v", w.Body, err)
	}
	return v
}

// The Location of a 202 is served: processing with Retry-After while the
// first request runs, then completed with its status and location; another
// tenant, an unknown or malformed id get 404 problem+json; nothing shows
// the key, the tenant or the body.
func TestOperations_ServesTheLocationOfA202(t *testing.T) {
	t.Parallel()
	for _, redisMode := range []bool{false, true} {
		t.Run(map[bool]string{false: "Postgres", true: "PostgresAndRedis"}[redisMode], func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{redis: redisMode, claim: []claim.Option{claim.WithPoll()}})
			h := withOperations(t, f)
			const key, body = "op-key-secret-1", `{"item":"secret-widget"}`
			started, release := make(chan struct{}), make(chan struct{})
			f.hook(func(n int64, r *http.Request) {
				if n == 1 {
					close(started)
					<-release
				}
			})
			first := make(chan *httptest.ResponseRecorder)
			go func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, newRequest("acme", http.MethodPost, "/orders", key, body))
				first <- w
			}()
			<-started
			dup := httptest.NewRecorder()
			h.ServeHTTP(dup, newRequest("acme", http.MethodPost, "/orders", key, body))
			loc := dup.Header().Get("Location")
			if dup.Code != http.StatusAccepted || !strings.HasPrefix(loc, "/operations/op_") {
				close(release)
				<-first
				t.Fatalf("duplicate while running = %d Location %q; want 202 /operations/op_...", dup.Code, loc)
			}
			w := getOp(t, h, "acme", loc)
			v := decodeOp(t, w)
			if v.State != "processing" || v.ID != strings.TrimPrefix(loc, "/operations/") || v.AcceptedAt.IsZero() || v.FinishedAt != nil || v.Result != nil {
				t.Errorf("while processing: %+v", v)
			}
			if ra := w.Header().Get("Retry-After"); ra != "3" {
				t.Errorf("while processing: Retry-After %q; want 3", ra)
			}
			for _, secret := range []string{key, "acme", "secret-widget", "POST /orders"} {
				if strings.Contains(w.Body.String(), secret) {
					t.Errorf("operation body %s shows %q", w.Body, secret)
				}
			}
			// Another tenant: the same 404 as an unknown id.
			other := getOp(t, h, "globex", loc)
			unknown := getOp(t, h, "acme", "/operations/op_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
			wantProblem(t, other, http.StatusNotFound, "about:blank", key)
			wantProblem(t, unknown, http.StatusNotFound, "about:blank", key)
			if other.Body.String() != unknown.Body.String() {
				t.Errorf("another tenant's 404 %s differs from an unknown id's %s", other.Body, unknown.Body)
			}
			close(release)
			if w := <-first; w.Code != http.StatusCreated {
				t.Fatalf("first = %d %s", w.Code, w.Body)
			}

			w = getOp(t, h, "acme", loc)
			v = decodeOp(t, w)
			if v.State != "completed" || v.FinishedAt == nil || v.FinishedAt.Before(v.AcceptedAt) ||
				v.Result == nil || v.Result.Status != http.StatusCreated || !strings.HasPrefix(v.Result.Location, "/orders/") {
				t.Errorf("once completed: %s", w.Body)
			}
			if ra := w.Header().Get("Retry-After"); ra != "" {
				t.Errorf("once completed: Retry-After %q; want none", ra)
			}
			if strings.Contains(w.Body.String(), "secret-widget") {
				t.Errorf("the stored body is served: %s", w.Body)
			}
			wantProblem(t, getOp(t, h, "globex", loc), http.StatusNotFound, "about:blank", key)

			for _, p := range []string{"/operations/", "/operations/nope", loc + "x", loc + "/x", "/operations/" + key} {
				wantProblem(t, getOp(t, h, "acme", p), http.StatusNotFound, "about:blank", key)
			}
			wantProblem(t, getOp(t, h, "", loc), http.StatusUnauthorized, claimclient.ProblemUnidentified, key)
		})
	}
}

// An uncertain operation is served as uncertain, with Retry-After; a
// released one is gone (404): nothing happened and the key is free.
func TestOperations_UncertainAndReleased(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	h := withOperations(t, f)
	ctx := t.Context()
	claimOne := func(key string) *claim.Lease {
		out, err := f.c.Claim(ctx, claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /jobs", Key: key}, Fingerprint: "v1:x"})
		if err != nil || out.Kind != claim.Acquired {
			t.Fatalf("claim: %v %v", out.Kind, err)
		}
		return out.Lease
	}
	u := claimOne("u-1")
	if err := u.MarkUncertain(ctx); err != nil {
		t.Fatal(err)
	}
	w := getOp(t, h, "acme", "/operations/"+u.OperationID())
	if v := decodeOp(t, w); v.State != "uncertain" || v.FinishedAt != nil || w.Header().Get("Retry-After") == "" {
		t.Errorf("uncertain: %s Retry-After %q", w.Body, w.Header().Get("Retry-After"))
	}
	r := claimOne("r-1")
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, getOp(t, h, "acme", "/operations/"+r.OperationID()), http.StatusNotFound, "about:blank", "r-1")

	post := httptest.NewRequest(http.MethodPost, "/operations/"+u.OperationID(), nil)
	post.Header.Set("Authorization", "Bearer acme")
	pw := httptest.NewRecorder()
	opsOnly, err := claimhttp.Operations(f.c, tenantOf)
	if err != nil {
		t.Fatal(err)
	}
	authenticate(opsOnly).ServeHTTP(pw, post)
	if pw.Code != http.StatusMethodNotAllowed || pw.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST = %d Allow %q; want 405 GET, HEAD", pw.Code, pw.Header().Get("Allow"))
	}
	if _, err := claimhttp.Operations[any](nil, tenantOf); !errors.Is(err, claimhttp.ErrConfig) {
		t.Errorf("nil Claimer: %v; want ErrConfig", err)
	}
	if _, err := claimhttp.Operations(f.c, nil); !errors.Is(err, claimhttp.ErrConfig) {
		t.Errorf("nil tenant: %v; want ErrConfig", err)
	}
}

// A tenant no record can have (not valid UTF-8, a control character) gets
// the 404 of an unknown operation, not a 500 from the store (issue 27 #8):
// bad input, answered without telling anything about the id.
func TestOperations_InvalidTenantIsNotFound(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	h := withOperations(t, f)
	ctx := t.Context()
	out, err := f.c.Claim(ctx, claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /jobs", Key: "bad-tenant-1"}, Fingerprint: "v1:x"})
	if err != nil || out.Kind != claim.Acquired {
		t.Fatalf("claim: %v %v", out.Kind, err)
	}
	if err := out.Lease.Complete(ctx, durable.Result{StatusCode: 201}); err != nil {
		t.Fatal(err)
	}
	loc := "/operations/" + out.OperationID
	decodeOp(t, getOp(t, h, "acme", loc)) // the operation exists for its tenant
	unknown := getOp(t, h, "acme", "/operations/op_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	wantProblem(t, unknown, http.StatusNotFound, "about:blank", "")
	for _, tenant := range []string{"acme\xff", "\xc3\x28", "ac\x01me", "acme\u0085"} {
		for _, path := range []string{loc, "/operations/op_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"} {
			w := getOp(t, h, tenant, path)
			wantProblem(t, w, http.StatusNotFound, "about:blank", "")
			if w.Body.String() != unknown.Body.String() {
				t.Errorf("tenant %q, %s: 404 %s differs from an unknown id's %s", tenant, path, w.Body, unknown.Body)
			}
		}
	}
}

// A workflow-mode handler runs steps through claimhttp.Step; while it runs
// one, the operation resource names it, and once completed shows none.
// Outside a guarded handler Step runs nothing.
func TestOperations_ShowTheStepOfARunningWorkflow(t *testing.T) {
	t.Parallel()
	f := setup(t, config{claim: []claim.Option{claim.WithPoll()}})
	h := withOperations(t, f)
	started, release := make(chan struct{}), make(chan struct{})
	var keys []string
	f.hook(func(n int64, r *http.Request) {
		ctx := r.Context()
		for _, name := range []string{"reserve", "charge"} {
			if _, err := claimhttp.Step(ctx, name, func(ctx context.Context, key string) ([]byte, error) {
				keys = append(keys, key)
				if name == "charge" {
					close(started)
					<-release
				}
				return []byte(name), nil
			}); err != nil {
				t.Errorf("Step(%s): %v", name, err)
			}
		}
	})
	first := make(chan *httptest.ResponseRecorder)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, newRequest("acme", http.MethodPost, "/orders", "step-key", `{"item":"w"}`))
		first <- w
	}()
	<-started
	dup := httptest.NewRecorder()
	h.ServeHTTP(dup, newRequest("acme", http.MethodPost, "/orders", "step-key", `{"item":"w"}`))
	loc := dup.Header().Get("Location")
	v := decodeOp(t, getOp(t, h, "acme", loc))
	if v.State != "processing" || v.Step == nil || v.Step.Name != "charge" || v.Step.State != "started" {
		t.Errorf("while the charge step runs: %+v (step %+v)", v, v.Step)
	}
	close(release)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatalf("first = %d %s", w.Code, w.Body)
	}
	if v := decodeOp(t, getOp(t, h, "acme", loc)); v.State != "completed" || v.Step != nil {
		t.Errorf("once completed: %+v", v)
	}
	if id := strings.TrimPrefix(loc, "/operations/"); len(keys) != 2 || keys[0] != id+"/reserve" || keys[1] != id+"/charge" {
		t.Errorf("step keys %q", keys)
	}
	ran := false
	if _, err := claimhttp.Step(t.Context(), "x", func(context.Context, string) ([]byte, error) { ran = true; return nil, nil }); !errors.Is(err, claimhttp.ErrNotGuarded) || ran {
		t.Errorf("Step outside a handler = %v (ran %v), want ErrNotGuarded", err, ran)
	}
}
