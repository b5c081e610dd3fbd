package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/examples/internal/apptest"
	"github.com/oncekey/oncekey/examples/internal/demokit"
	"github.com/oncekey/oncekey/examples/internal/program"
)

const book = `{"item":"book","quantity":1}`

// The first command of the README: with no service named, the demo runs
// on the embedded default, exits 0, shows one order for the duplicated
// requests, and removes its temporary database.
func TestDemo_NoServicesNamed(t *testing.T) {
	t.Parallel()
	out := readmeDemo.Embedded(t)
	for _, want := range []string{"durable store: SQLite ", "(embedded default: no -postgres or DATABASE_URL", "redis: in-process miniredis"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`SQLite (\S+) `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no SQLite path in the output:\n%s", out)
	}
	if _, err := os.Stat(m[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary database %s is still there after the demo (stat: %v)", m[1], err)
	}
}

// A named Redis that does not answer (a closed local port) does not stop
// the program: it warns once that it runs on the durable store alone, says
// so on start, and the demo's story holds.
func TestDemo_UnreachableRedisRunsOnTheDurableStore(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	env := map[string]string{"REDIS_URL": "redis://" + addr + "/0"}
	o, err := parseOptions([]string{"-demo", "-data", t.TempDir()}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out, logs bytes.Buffer
	o.Backend.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(t.Context(), o, &out); err != nil {
		t.Fatalf("demo with Redis at a closed port: %v\n%s", err, &out)
	}
	readmeDemo.WantStory(t, out.String())
	if want := "redis: " + addr + "/0 unreachable (named by -redis or REDIS_URL); running on SQLite alone"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, &out)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "running on SQLite alone") {
		t.Errorf("no warning logged:\n%s", &logs)
	}
}

// The README's second demo command: the same story on PostgreSQL and Redis.
func TestDemo_OnPostgresAndRedis(t *testing.T) {
	t.Parallel()
	readmeDemo.OnRealServers(t)
}

// readmeDemo is the demo as the README runs it (-demo), and the story it
// tells.
var readmeDemo = apptest.Demo[options]{
	Parse: parseOptions,
	Run:   run,
	Flags: func(o *options) *program.Flags { return &o.Flags },
	Story: []string{
		"1. 20 concurrent POST /orders with one key: 20 × 201",
		"; 1 executed, 19 replayed",
		"2. the same key for another item: 422 Idempotency key reused",
		"3. no key: 400 Idempotency key missing",
		"got 201 (Idempotent-Replayed: true) for order ord_",
		"(the service saw 2 requests)",
		"has 2 (step 1's 20 requests made one, step 4 one)",
		"demo: every expectation held",
	},
}

// The demo's expectations can fail: against a service that creates an
// order for every request, it reports the failures and returns errDemo.
func TestDemo_FailsAgainstAServiceWithoutIdempotency(t *testing.T) {
	t.Parallel()
	naive := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			fmt.Fprint(w, `{"orders":[]}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"item":"book","quantity":1}`, newID("ord_"))
	})
	cut := &cutter{next: naive}
	srv := httptest.NewServer(cut)
	defer srv.Close()
	var out bytes.Buffer
	err := runDemo(t.Context(), srv.URL, cut, &out)
	if !errors.Is(err, errDemo) {
		t.Fatalf("demo against a naive service: err = %v, want errDemo\n%s", err, &out)
	}
	for _, want := range []string{"FAILED: 20 requests executed, want exactly 1", "FAILED: reused key: 201"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &out)
		}
	}
}

// Fifty clients send the same order with one key at once, each with its
// own retrying transport: exactly one order row, and every client ends
// with the same 201.
func TestOrders_FiftyConcurrentIdenticalRequests(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		const clients = 50
		key := demokit.MustKey()
		executed := 0
		for _, r := range f.PostAtOnce(clients, "/orders", "acme", key, book) {
			if !r.Replayed() {
				executed++
			}
		}
		if executed != 1 {
			t.Errorf("%d answers were not replays, want 1", executed)
		}
		if n := f.orders("acme"); n != 1 {
			t.Fatalf("orders = %d, want exactly 1", n)
		}
	})
}

// The same key for another request is 422 and changes nothing; the
// original request still replays byte for byte.
func TestOrders_SameKeyAnotherRequestIs422(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := demokit.MustKey()
		first := f.post(nil, "acme", key, book)
		wantStatus(t, "first", first, http.StatusCreated, "")
		wantStatus(t, "another item", f.post(nil, "acme", key, `{"item":"lamp","quantity":1}`), http.StatusUnprocessableEntity, claimclient.ProblemKeyReused)
		wantStatus(t, "another quantity", f.post(nil, "acme", key, `{"item":"book","quantity":2}`), http.StatusUnprocessableEntity, claimclient.ProblemKeyReused)
		again := f.post(nil, "acme", key, `{ "quantity": 1, "item": "book" }`) // the same request, spelled differently
		if again.Status != http.StatusCreated || !again.Replayed() || again.Body != first.Body {
			t.Fatalf("retry: %d replayed=%v %s; want the replay of %s", again.Status, again.Replayed(), again.Body, first.Body)
		}
		if loc := again.Header.Get("Location"); loc != "/orders/"+first.Value.ID {
			t.Errorf("replayed Location = %q, want /orders/%s", loc, first.Value.ID)
		}
		if n := f.orders("acme"); n != 1 {
			t.Fatalf("orders = %d, want 1", n)
		}
	})
}

// Keys are per tenant: two tenants with one key get two orders, and
// neither sees the other's.
func TestOrders_TwoTenantsOneKeyAreTwoOrders(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := demokit.MustKey()
		a := f.post(nil, "acme", key, book)
		b := f.post(nil, "globex", key, book)
		if a.Status != http.StatusCreated || b.Status != http.StatusCreated || a.Replayed() || b.Replayed() || a.Value.ID == b.Value.ID {
			t.Fatalf("acme: %d %s; globex: %d %s; want two new orders", a.Status, a.Body, b.Status, b.Body)
		}
		if na, nb := f.orders("acme"), f.orders("globex"); na != 1 || nb != 1 {
			t.Fatalf("orders: acme %d, globex %d; want 1 and 1", na, nb)
		}
		if got := f.get("acme", "/orders/"+a.Value.ID); got.Status != http.StatusOK || got.Value != a.Value {
			t.Errorf("GET own order: %d %s", got.Status, got.Body)
		}
		wantStatus(t, "GET another tenant's order", f.get("globex", "/orders/"+a.Value.ID), http.StatusNotFound, problemNotFound)
	})
}

// Requests that are refused before the claim reserve nothing: a missing
// key, a missing credential, an invalid order. The corrected request then
// runs with the same key.
func TestOrders_RefusedRequestsReserveNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		wantStatus(t, "no key", f.post(nil, "acme", "", book), http.StatusBadRequest, claimclient.ProblemKeyMissing)
		key := demokit.MustKey()
		wantStatus(t, "no credential", f.post(nil, "", key, book), http.StatusUnauthorized, claimclient.ProblemUnidentified)
		wantStatus(t, "quantity 0", f.post(nil, "acme", key, `{"item":"book","quantity":0}`), http.StatusBadRequest, problemInvalidOrder)
		wantStatus(t, "unknown field", f.post(nil, "acme", key, `{"item":"book","quantity":1,"price":0}`), http.StatusBadRequest, problemInvalidOrder)
		if n := f.orders("acme"); n != 0 {
			t.Fatalf("orders = %d after refused requests, want 0", n)
		}
		r := f.post(nil, "acme", key, book)
		if r.Status != http.StatusCreated || r.Replayed() {
			t.Fatalf("corrected request with the same key: %d replayed=%v %s; want a new 201", r.Status, r.Replayed(), r.Body)
		}
	})
}

// The service commits, the connection is cut before the answer, and the
// client transport's retry with the same key gets the stored 201: one
// order.
func TestOrders_CutResponseIsRetriedAndReplayed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := demokit.MustKey()
		f.cut.arm(key)
		fresh := &http.Transport{} // a new connection, which net/http does not retry on its own
		defer fresh.CloseIdleConnections()
		tr, err := claimclient.NewTransport(fresh, claimclient.WithBaseDelay(10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		r := f.post(tr, "acme", key, book)
		if r.Status != http.StatusCreated || !r.Replayed() {
			t.Fatalf("after the cut: %d replayed=%v %s; want the replayed 201", r.Status, r.Replayed(), r.Body)
		}
		if n := f.cut.requests(); n != 2 {
			t.Errorf("the service saw %d requests with the key, want 2", n)
		}
		if n := f.orders("acme"); n != 1 {
			t.Fatalf("orders = %d, want 1", n)
		}
	})
}

func TestParseOptions(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://db.example/x", "REDIS_URL": "redis://cache.example/0"}
	o, err := parseOptions(nil, emptyEnv, io.Discard)
	if err != nil || o.Backend.DatabaseURL != "" || o.Backend.RedisURL != "" || o.demo {
		t.Errorf("no env, no flags: %+v, %v; want the embedded default", o, err)
	}
	o, err = parseOptions(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil || o.Backend.DatabaseURL != env["DATABASE_URL"] || o.Backend.RedisURL != env["REDIS_URL"] {
		t.Errorf("env: %+v, %v; want the URLs from the environment", o, err)
	}
	o, err = parseOptions([]string{"-postgres", "postgres://flag.example/y", "-redis", "", "-data", "d", "-demo"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || o.Backend.DatabaseURL != "postgres://flag.example/y" || o.Backend.RedisURL != "" || o.Backend.DataDir != "d" || !o.demo {
		t.Errorf("flags: %+v, %v; want the flags to win", o, err)
	}
	if _, err := parseOptions([]string{"extra"}, emptyEnv, io.Discard); err == nil {
		t.Error("a stray argument was accepted")
	}
}

// Every Location the service hands out resolves: the 201's /orders/ord_...
// (and the replay's, the same) is 200 with the order for its tenant, 404
// for another.
func TestOrders_LocationsResolve(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := demokit.MustKey()
		first := f.post(nil, "acme", key, book)
		wantStatus(t, "first", first, http.StatusCreated, "")
		again := f.post(nil, "acme", key, book)
		for _, r := range []response{first, again} {
			loc := r.Header.Get("Location")
			got := f.get("acme", loc)
			if loc == "" || got.Status != http.StatusOK || got.Value.ID != first.Value.ID || got.Value.Item != "book" {
				t.Fatalf("GET %q = %d %s; want 200 with order %s", loc, got.Status, got.Body, first.Value.ID)
			}
			if other := f.get("globex", loc); other.Status != http.StatusNotFound {
				t.Errorf("another tenant's GET %s = %d; want 404", loc, other.Status)
			}
		}
	})
}
