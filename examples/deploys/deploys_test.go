package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/examples/internal/backend"
)

// The demo's story holds on the embedded default (SQLite file, in-process
// Redis): every expectation it prints is checked by runDemo, which fails
// otherwise.
func TestDemo_EmbeddedDefault(t *testing.T) {
	var out bytes.Buffer
	o := options{demo: true}
	o.Backend = backend.Config{Name: "deploys", DataDir: t.TempDir(), RedisPrefix: "deploys-test"}
	if err := run(t.Context(), o, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"1. POST /deploys: 202", "10 × 202 with the same Location", "processing → completed", "another tenant's GET", ": 404", "Idempotent-Replayed: true", "1 deploy applied", "GET /deploys/dep_", "7. an incomplete body: 400 (nothing reserved); the corrected body with the same key: 202, then processing → completed", "every expectation held"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the story lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseOptions(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "postgres://db", "REDIS_URL": "redis://r"}
	o, err := parseOptions([]string{"-demo"}, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err != nil || !o.demo || o.Backend.DatabaseURL != "postgres://db" || o.Backend.RedisURL != "redis://r" || o.addr != "127.0.0.1:8082" {
		t.Fatalf("parseOptions = %+v, %v", o, err)
	}
	if _, err := parseOptions([]string{"extra"}, func(string) string { return "" }, &bytes.Buffer{}); err == nil {
		t.Fatal("an extra argument was accepted")
	}
}

// fixture is the service on the embedded default behind an httptest
// server, with its worker running.
func fixture(t *testing.T) (*app[*sql.Tx], *backend.Backend, string) {
	t.Helper()
	b, err := backend.Open(t.Context(), backend.Config{Name: "deploys", DataDir: t.TempDir(), RedisPrefix: "deploys-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	a, err := newApp(t.Context(), b, sqliteRiver(b), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.startWorker(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.stopWorker(context.Background()) })
	srv := httptest.NewServer(a.handler)
	t.Cleanup(srv.Close)
	return a, b, srv.URL
}

func call(t *testing.T, method, url, tenant, key, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tenant)
	if key != "" {
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// Every Location the service hands out resolves: the 202's
// /operations/op_... (200, processing then completed, its result naming
// the deploy), and the deploy's /deploys/dep_... from the operation and
// from the replay (200, the deploy); another tenant gets 404 for both.
func TestLocationsResolve(t *testing.T) {
	t.Parallel()
	_, _, url := fixture(t)
	code, hdr, body := call(t, http.MethodPost, url+"/deploys", "acme", "loc-1", `{"service":"api","version":"1.0.0"}`)
	opLoc := hdr.Get("Location")
	if code != http.StatusAccepted || !strings.HasPrefix(opLoc, "/operations/op_") {
		t.Fatalf("POST = %d Location %q %s; want 202 /operations/op_...", code, opLoc, body)
	}
	if code, _, body := call(t, http.MethodGet, url+opLoc, "acme", "", ""); code != http.StatusOK {
		t.Fatalf("GET %s = %d %s; want 200", opLoc, code, body)
	}
	var op struct {
		State  string `json:"state"`
		Result struct {
			Location string `json:"location"`
		} `json:"result"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for op.State != "completed" {
		if time.Now().After(deadline) {
			t.Fatalf("the deploy did not complete: %+v", op)
		}
		time.Sleep(100 * time.Millisecond)
		_, _, body := call(t, http.MethodGet, url+opLoc, "acme", "", "")
		if err := json.Unmarshal([]byte(body), &op); err != nil {
			t.Fatalf("operation %q: %v", body, err)
		}
	}
	code, hdr, _ = call(t, http.MethodPost, url+"/deploys", "acme", "loc-1", `{"service":"api","version":"1.0.0"}`)
	depLoc := hdr.Get("Location")
	if code != http.StatusCreated || depLoc != op.Result.Location || !strings.HasPrefix(depLoc, "/deploys/dep_") {
		t.Fatalf("replay = %d Location %q, operation's result location %q", code, depLoc, op.Result.Location)
	}
	code, _, body = call(t, http.MethodGet, url+depLoc, "acme", "", "")
	if code != http.StatusOK || !strings.Contains(body, `"service":"api"`) || !strings.Contains(body, `"version":"1.0.0"`) {
		t.Fatalf("GET %s = %d %s; want 200 with the deploy", depLoc, code, body)
	}
	for _, loc := range []string{opLoc, depLoc} {
		if code, _, _ := call(t, http.MethodGet, url+loc, "globex", "", ""); code != http.StatusNotFound {
			t.Errorf("another tenant's GET %s = %d; want 404", loc, code)
		}
	}
}

// An incomplete body is refused before the claim (claimriver.WithValidate):
// a 400 problem at once, no job, and the corrected body with the same key
// runs (without the check it was 202, then a replayed 400 for ever, and
// the corrected body 422).
func TestInvalidBodyReservesNothing(t *testing.T) {
	t.Parallel()
	_, b, url := fixture(t)
	code, hdr, body := call(t, http.MethodPost, url+"/deploys", "acme", "bad-1", `{"service":"api"}`)
	if code != http.StatusBadRequest || hdr.Get("Content-Type") != "application/problem+json" || hdr.Get("Idempotency-Retention") == "" ||
		!strings.Contains(body, `"detail":"send one JSON object with \"service\" and \"version\""`) {
		t.Fatalf("incomplete body = %d %v %s; want a 400 problem", code, hdr, body)
	}
	var jobs, records int
	if err := b.DB.QueryRowContext(t.Context(), `SELECT (SELECT count(*) FROM river_job), (SELECT count(*) FROM idempotency_requests)`).Scan(&jobs, &records); err != nil {
		t.Fatal(err)
	}
	if jobs != 0 || records != 0 {
		t.Fatalf("after the refusal: %d jobs, %d records; want none", jobs, records)
	}
	if code, _, body := call(t, http.MethodPost, url+"/deploys", "acme", "bad-1", `{"service":"api","version":"1.0.0"}`); code != http.StatusAccepted {
		t.Fatalf("the corrected body with the same key = %d %s; want 202", code, body)
	}
}
