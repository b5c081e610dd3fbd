package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/examples/internal/apptest"
	"github.com/oncekey/oncekey/examples/internal/demokit"
	"github.com/oncekey/oncekey/examples/internal/program"
)

const pay = `{"amount":1299,"currency":"EUR"}`

// With no service named, the demo runs on the embedded default, exits 0,
// and shows one charge for the duplicated requests and the 202 uncertain
// path resolved by the reconciler.
func TestDemo_NoServicesNamed(t *testing.T) {
	t.Parallel()
	out := readmeDemo.Embedded(t)
	if !strings.Contains(out, "redis: in-process miniredis") {
		t.Errorf("output does not say it runs on the embedded default:\n%s", out)
	}
}

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
		"1. 20 concurrent POST /payments with one key: 20 × 201, all for charge ch_0001; 1 executed, 19 replayed",
		"the gateway was asked once",
		"2. the same key for another amount: 422 Idempotency key reused",
		"3. the gateway made charge ch_0002, then timed out: 202 Outcome being reconciled, Location /operations/op_",
		"got 201 (Idempotent-Replayed: true) for charge ch_0002; the gateway was asked to charge once",
		"gateway: 2 charges from 2 charge requests, for the 2 payments",
		"demo: every expectation held",
	},
}

// The gateway charges, then times out: 202 uncertain, to the request and
// to a retry, nothing charged twice; the reconciler asks the gateway and
// stores the answer the handler would have given, which the next retry
// gets, replayed.
func TestPayments_UncertainIsReconciledThenReplayed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := demokit.MustKey()
		r := f.postTimedOut(t, modeTimeoutAfterCharge, key)
		op := r.Problem.OperationID
		if loc := r.Header.Get("Location"); op == "" || loc != "/operations/"+op {
			t.Errorf("Location = %q, operation_id %q", loc, op)
		}
		ch, posts, charged := f.gw.chargeFor(op)
		if !charged || posts != 1 {
			t.Fatalf("gateway: charged=%v after %d requests with the operation id; want one charge", charged, posts)
		}
		wantStatus(t, "retry while uncertain", f.post(nil, "acme", key, pay), http.StatusAccepted, claimclient.ProblemUncertain)

		rep, err := f.app.reconcileOnce(t.Context())
		if err != nil || rep.Resolved != 1 {
			t.Fatalf("reconcile: %+v, %v; want 1 resolved (as completed: the replay below)", rep, err)
		}
		again := f.post(nil, "acme", key, pay)
		_, want := resultFor(ch)
		if again.Status != http.StatusCreated || !again.Replayed() || again.Body != string(want.Body) || again.Value.ChargeID != ch.ID {
			t.Fatalf("after reconciling: %d replayed=%v %s; want the replayed 201 %s", again.Status, again.Replayed(), again.Body, want.Body)
		}
		if _, posts, _ := f.gw.chargeFor(op); posts != 1 {
			t.Errorf("the gateway got %d charge requests for the payment, want 1", posts)
		}
		if charges, requests := f.gw.totals(); charges != 1 || requests != 1 {
			t.Errorf("gateway: %d charges from %d requests, want 1 and 1", charges, requests)
		}
		if rep, err := f.app.reconcileOnce(t.Context()); err != nil || rep.Scanned != 0 {
			t.Errorf("second pass: %+v, %v; want nothing left", rep, err)
		}
	})
}

// The gateway times out without charging: the reconciler finds no charge
// and stores a final "not charged" answer; nothing is ever charged.
func TestPayments_UncertainWithoutChargeIsReconciledAsNotCharged(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := demokit.MustKey()
		f.postTimedOut(t, modeTimeoutBeforeCharge, key)
		rep, err := f.app.reconcileOnce(t.Context())
		if err != nil || rep.Resolved != 1 {
			t.Fatalf("reconcile: %+v, %v; want 1 resolved (as failed: the replay below)", rep, err)
		}
		again := f.post(nil, "acme", key, pay)
		wantStatus(t, "after reconciling", again, http.StatusFailedDependency, problemNotCharged)
		if !again.Replayed() {
			t.Error("the not-charged answer is not a replay")
		}
		if charges, _ := f.gw.totals(); charges != 0 {
			t.Errorf("gateway made %d charges, want 0", charges)
		}
	})
}

// Fifty clients send one payment with one key at once: the gateway is
// asked once, and every client ends with the same 201.
func TestPayments_FiftyConcurrentDuplicatesChargeOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		const clients = 50
		key := demokit.MustKey()
		f.PostAtOnce(clients, "/payments", "acme", key, pay)
		if charges, requests := f.gw.totals(); charges != 1 || requests != 1 {
			t.Fatalf("gateway: %d charges from %d requests, want 1 and 1", charges, requests)
		}
	})
}

// A declined charge is a final answer: stored as failed and replayed,
// never sent to the gateway again. The same key for another amount is
// 422, and the gateway hears nothing of it.
func TestPayments_DeclineIsReplayedAndReuseIs422(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := demokit.MustKey()
		big := `{"amount":200000,"currency":"EUR"}`
		first := f.post(nil, "acme", key, big)
		if first.Status != http.StatusPaymentRequired || first.Value.Status != "declined" || first.Replayed() {
			t.Fatalf("large amount: %d %s; want 402 declined", first.Status, first.Body)
		}
		again := f.post(nil, "acme", key, big)
		if again.Status != http.StatusPaymentRequired || !again.Replayed() || again.Body != first.Body {
			t.Fatalf("retry: %d replayed=%v %s; want the replayed 402", again.Status, again.Replayed(), again.Body)
		}
		wantStatus(t, "another amount", f.post(nil, "acme", key, pay), http.StatusUnprocessableEntity, claimclient.ProblemKeyReused)
		if _, requests := f.gw.totals(); requests != 1 {
			t.Errorf("gateway got %d charge requests, want 1", requests)
		}
	})
}

// When the gateway cannot be reached nothing was charged: 503, and the key
// is released, so the same key then runs again, even with another amount
// (a record still held would answer 422).
func TestPayments_UnreachableGatewayReleasesTheKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		f.gw.close()
		key := demokit.MustKey()
		wantStatus(t, "gateway down", f.post(nil, "acme", key, pay), http.StatusServiceUnavailable, problemUnavailable)
		wantStatus(t, "same key, another amount", f.post(nil, "acme", key, `{"amount":1,"currency":"EUR"}`), http.StatusServiceUnavailable, problemUnavailable)
		if rep, err := f.app.reconcileOnce(t.Context()); err != nil || rep.Scanned != 0 {
			t.Errorf("reconcile: %+v, %v; want nothing to reconcile", rep, err)
		}
	})
}

func TestParseOptions(t *testing.T) {
	t.Parallel()
	o, err := parseOptions([]string{"-gateway-mode", "timeout-after-charge", "-gateway-timeout", "1s", "-reconcile-every", "3s"}, emptyEnv, io.Discard)
	if err != nil || o.gatewayMode != modeTimeoutAfterCharge || o.gatewayTimeout != time.Second || o.reconcileEvery != 3*time.Second {
		t.Errorf("flags: %+v, %v", o, err)
	}
	if o.Backend.DatabaseURL != "" || o.Backend.RedisURL != "" {
		t.Errorf("no env: %+v; want the embedded default", o.Backend)
	}
	env := map[string]string{"DATABASE_URL": "postgres://db.example/x", "REDIS_URL": "redis://cache.example/0"}
	o, err = parseOptions(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil || o.Backend.DatabaseURL != env["DATABASE_URL"] || o.Backend.RedisURL != env["REDIS_URL"] {
		t.Errorf("env: %+v, %v", o.Backend, err)
	}
	for _, bad := range [][]string{{"-gateway-mode", "flaky"}, {"-gateway-timeout", "0s"}, {"-reconcile-every", "-1s"}, {"stray"}} {
		if _, err := parseOptions(bad, emptyEnv, io.Discard); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

// The 202's Location resolves: GET /operations/op_... is 200 with the state
// (uncertain, then, once reconciled, completed with the stored 201), 404
// for another tenant. No other answer carries a Location.
func TestPayments_LocationsResolve(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := demokit.MustKey()
		r := f.postTimedOut(t, modeTimeoutAfterCharge, key)
		loc := r.Header.Get("Location")
		type view struct {
			ID     string `json:"id"`
			State  string `json:"state"`
			Result *struct {
				Status int `json:"status"`
			} `json:"result"`
		}
		follow := func(tenant string) (int, view) {
			t.Helper()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.URL+loc, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+tenant)
			resp, err := f.Plain.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var v view
			if resp.StatusCode == http.StatusOK {
				if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
					t.Fatal(err)
				}
			}
			return resp.StatusCode, v
		}
		if code, v := follow("acme"); code != http.StatusOK || v.State != "uncertain" || "/operations/"+v.ID != loc {
			t.Fatalf("GET %s = %d %+v; want 200 uncertain", loc, code, v)
		}
		if code, _ := follow("globex"); code != http.StatusNotFound {
			t.Errorf("another tenant's GET %s = %d; want 404", loc, code)
		}
		if rep, err := f.app.reconcileOnce(t.Context()); err != nil || rep.Resolved != 1 {
			t.Fatalf("reconcile: %+v, %v", rep, err)
		}
		if code, v := follow("acme"); code != http.StatusOK || v.State != "completed" || v.Result == nil || v.Result.Status != http.StatusCreated {
			t.Fatalf("GET %s once reconciled = %d %+v; want 200 completed, result 201", loc, code, v)
		}
		if again := f.post(nil, "acme", key, pay); again.Status != http.StatusCreated || again.Header.Get("Location") != "" {
			t.Errorf("replay = %d Location %q; want 201 without a Location", again.Status, again.Header.Get("Location"))
		}
	})
}
