package claimhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/wire"
)

// resolveUncertain makes one uncertain operation per result (a handler
// that marked its outcome uncertain), resolves each with a Reconciler
// storing that result as state, and returns the keys and request bodies.
func resolveUncertain(t *testing.T, f *fixture, state durable.State, results []durable.Result) (keys, bodies []string) {
	t.Helper()
	byOp := map[string]durable.Result{}
	for i, res := range results {
		key, body := fmt.Sprint("resolved-", state, "-", i), fmt.Sprintf(`{"item":"r%d","uncertain":true}`, i)
		w := f.post("acme", key, body)
		p := wantProblem(t, w, http.StatusAccepted, claimclient.ProblemUncertain, key)
		byOp[p.OperationID] = res
		keys, bodies = append(keys, key), append(bodies, body)
	}
	rec, err := claim.NewReconciler(f.c, func(_ context.Context, rec durable.Record) (claim.Resolution, error) {
		res, ok := byOp[rec.Ref.OperationID()]
		if !ok {
			return claim.Unresolved(), nil
		}
		return claim.Resolved(state, res), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := rec.RunOnce(t.Context()); err != nil || rep.Resolved != len(results) {
		t.Fatalf("reconciler: %+v %v", rep, err)
	}
	return keys, bodies
}

// A result in claimgrpc's format, or with a status that no final HTTP
// response has (a gRPC code stored under version 1, as claimgrpc wrote
// before it had a version of its own), is not replayed: a 500 problem,
// never a 200 with a protobuf body (nor a panic in WriteHeader).
func TestReplay_ForeignFormatIsNotSuccess(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	foreign := []durable.Result{
		{StatusCode: 0, Headers: map[string][]string{"Grpc-Message-Type": {"google.protobuf.StringValue"}}, Body: []byte{0x0a, 0x04, 'c', 'h', '_', '1'}, Version: wire.ResultGRPC},
		{StatusCode: 5, Body: []byte{0x08, 0x05}, Version: wire.ResultGRPC},
		{StatusCode: 5, Body: []byte{0x08, 0x05}, Version: 1},
		{StatusCode: 102, Version: 1},
	}
	keys, bodies := resolveUncertain(t, f, durable.Failed, foreign)
	for i := range keys {
		for range 2 { // from Redis, then again
			w := f.post("acme", keys[i], bodies[i])
			wantProblem(t, w, http.StatusInternalServerError, claimclient.ProblemInternal, keys[i])
		}
	}
	if n := f.runs.Load(); n != int64(len(foreign)) {
		t.Fatalf("%d handler runs, want %d", n, len(foreign))
	}
}

// ResponseResult stores what the handler would have answered; every retry
// gets exactly that, marked replayed.
func TestResponseResult_ReplaysExactly(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	res, err := claimhttp.ResponseResult(http.StatusCreated, http.Header{"content-type": {"application/json"}, "Location": {"/orders/7"}}, []byte(`{"id":7}`))
	if err != nil {
		t.Fatal(err)
	}
	if res.ResourceID != "/orders/7" {
		t.Fatalf("ResourceID %q", res.ResourceID)
	}
	keys, bodies := resolveUncertain(t, f, durable.Completed, []durable.Result{res})
	for range 2 {
		w := f.post("acme", keys[0], bodies[0])
		if w.Code != http.StatusCreated || w.Body.String() != `{"id":7}` || w.Header().Get("Content-Type") != "application/json" ||
			w.Header().Get("Location") != "/orders/7" || w.Header().Get(claimclient.HeaderReplayed) != "true" {
			t.Fatalf("replay: %d %v %q", w.Code, w.Header(), w.Body.String())
		}
	}
	for _, bad := range []struct {
		status int
		body   string
	}{{0, ""}, {102, ""}, {600, ""}, {204, "x"}, {304, "x"}} {
		if _, err := claimhttp.ResponseResult(bad.status, nil, []byte(bad.body)); err == nil {
			t.Errorf("ResponseResult(%d, %q): no error", bad.status, bad.body)
		}
	}
}
