package claimhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// The entry-point conformance suite against the middleware in workflow
// mode. Its top-level tests are not parallel, so no other test of the
// package runs beside them: the negative controls break the settlement of
// the whole process.

func TestConformance(t *testing.T) { entrytest.Run(t, httpDriver{}) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, httpDriver{})
}

// conformanceMaxBody is the driver's MaxStoredBody and MaxResponseBody:
// above the 64 KiB Redis caches, so the too-large window's result is kept
// whole by the middleware and still not cached.
const conformanceMaxBody = 128 << 10

// conformanceStatusFailed is the status of the suite's business failures:
// stored as failed (a status of 400 or more, DESIGN 6.3).
const conformanceStatusFailed = http.StatusPaymentRequired

type httpDriver struct{}

func (httpDriver) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "t1", MaxResult: conformanceMaxBody}
}

func (httpDriver) Start(env entrytest.Env) entrytest.Adapter {
	t := env.T
	guard, err := claimhttp.Middleware(env.Claimer, tenantOf,
		claimhttp.WithMaxStoredBody(conformanceMaxBody), claimhttp.WithMaxResponseBody(conformanceMaxBody))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /ops", guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read the request body: %v", err)
		}
		resp := env.Handler(ctx, claimhttp.OperationID(ctx), body)
		switch resp.Kind {
		case entrytest.Unknown:
			if err := claimhttp.MarkUncertain(ctx); err != nil {
				t.Errorf("MarkUncertain: %v", err)
			}
			http.Error(w, "downstream outcome unknown", http.StatusGatewayTimeout)
			return
		case entrytest.Failure:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(conformanceStatusFailed)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = w.Write(resp.Body)
	})))
	srv := httptest.NewServer(authenticate(mux))
	t.Cleanup(srv.Close)
	return &httpAdapter{url: srv.URL + "/ops", client: srv.Client()}
}

// Encode is what an operator or a Reconciler stores to resolve a request
// of this route: the middleware's own format, from its exported encoder.
func (httpDriver) Encode(r entrytest.Response) durable.Result {
	status := http.StatusCreated
	if r.Kind == entrytest.Failure {
		status = conformanceStatusFailed
	}
	res, err := claimhttp.ResponseResult(status, http.Header{"Content-Type": {"application/json"}}, r.Body)
	if err != nil {
		panic(err)
	}
	return res
}

type httpAdapter struct {
	url    string
	client *http.Client
}

func (a *httpAdapter) Send(ctx context.Context, key string, payload []byte) entrytest.Answer {
	res, body, err := entrytest.Post(ctx, a.client, a.url, key, payload, http.Header{"Authorization": {"Bearer t1"}})
	if err != nil {
		return entrytest.Answer{Outcome: entrytest.Error, Detail: err.Error()}
	}
	detail := strconv.Itoa(res.StatusCode)
	if res.Header.Get("Content-Type") == problemContentType {
		var p problem
		if err := json.Unmarshal(body, &p); err != nil {
			return entrytest.Answer{Outcome: entrytest.Error, Detail: detail + " unreadable problem"}
		}
		detail += " " + p.Type
		switch p.Type {
		case claimclient.ProblemInProgress:
			return entrytest.Answer{Outcome: entrytest.InProgress, Detail: detail}
		case claimclient.ProblemUncertain:
			return entrytest.Answer{Outcome: entrytest.Uncertain, Detail: detail}
		case claimclient.ProblemKeyReused:
			return entrytest.Answer{Outcome: entrytest.Rejected, Detail: detail}
		}
		return entrytest.Answer{Outcome: entrytest.Error, Detail: detail}
	}
	if res.StatusCode != http.StatusCreated && res.StatusCode != conformanceStatusFailed {
		return entrytest.Answer{Outcome: entrytest.Error, Detail: detail}
	}
	out := entrytest.Answer{Outcome: entrytest.Executed, Detail: detail, Result: entrytest.Result{
		Failed:  res.StatusCode == conformanceStatusFailed,
		Body:    body,
		Omitted: res.Header.Get(claimclient.HeaderBodyOmitted) == "true",
	}}
	if res.Header.Get(claimclient.HeaderReplayed) == "true" {
		out.Outcome = entrytest.Replayed
	}
	return out
}
