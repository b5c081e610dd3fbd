package claimriver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// The entry-point conformance suite against async mode: requests through
// Runner.Handler, the work run by a River client. Its top-level tests are
// not parallel, so no other test of the package runs beside them: the
// negative controls break the settlement of the whole process.

func TestConformance(t *testing.T) { entrytest.Run(t, riverDriver{}) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, riverDriver{})
}

const (
	// conformanceJobTimeout is the River client's JobTimeout: the
	// transport's own timer, shorter than the lease, that the long-work
	// window outlasts.
	conformanceJobTimeout = time.Second
	// conformanceStatusFailed is the status of the suite's business
	// failures (claim.Reject).
	conformanceStatusFailed = http.StatusUnprocessableEntity
)

type riverDriver struct{}

func (riverDriver) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "t1", Timer: conformanceJobTimeout, NotApplicable: map[string]string{
		entrytest.CallerGone: "async mode answers 202 once the job is queued: the work never runs in the caller's request",
		entrytest.Oversized:  "claimriver stores the work's own durable.Result: it has no result size limit of its own (WithMaxBody bounds the request)",
	}}
}

// Encode is the work's own result: River work returns the durable.Result
// the handler replays (a failure through claim.Reject).
func (riverDriver) Encode(r entrytest.Response) durable.Result {
	status := http.StatusCreated
	if r.Kind == entrytest.Failure {
		status = conformanceStatusFailed
	}
	return durable.Result{StatusCode: status, Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: r.Body}
}

func (riverDriver) Start(suite entrytest.Env) entrytest.Adapter {
	t := suite.T
	ctx := context.Background()
	s := suite.Schema
	m, err := rivermigrate.New(riverpgxv5.New(s.Pool), &rivermigrate.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	runner, err := New(suite.Claimer, func(ctx context.Context, job Job) (durable.Result, error) {
		r := suite.Handler(ctx, job.OperationID, job.Payload)
		switch r.Kind {
		case entrytest.Failure:
			return durable.Result{}, claim.Reject(riverDriver{}.Encode(r))
		case entrytest.Unknown:
			return durable.Result{}, errors.New("downstream outcome unknown")
		}
		return riverDriver{}.Encode(r), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	workers := river.NewWorkers()
	if err := runner.Register(workers); err != nil {
		t.Fatal(err)
	}
	cfg := &river.Config{
		Schema:            s.Name,
		Workers:           workers,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		JobTimeout:        conformanceJobTimeout,
		TestOnly:          true,
		RetryPolicy:       fastRetry{},
	}
	// River's client works on the direct pool: only the Claimer's store
	// goes through the suite's proxy.
	client, err := river.NewClient(riverpgxv5.New(s.Pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.StopAndCancel(ctx)
	})
	h, err := runner.Handler(client, "POST /jobs", func(*http.Request) (string, error) { return "t1", nil })
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &riverAdapter{url: srv.URL, client: srv.Client()}
}

type riverAdapter struct {
	url    string
	client *http.Client
}

func (a *riverAdapter) Send(ctx context.Context, key string, payload []byte) entrytest.Answer {
	res, body, err := entrytest.Post(ctx, a.client, a.url, key, payload, nil)
	if err != nil {
		return entrytest.Answer{Outcome: entrytest.Error, Detail: err.Error()}
	}
	detail := strconv.Itoa(res.StatusCode)
	if res.Header.Get(claimclient.HeaderReplayed) == "true" {
		return entrytest.Answer{Outcome: entrytest.Replayed, Detail: detail, Result: entrytest.Result{
			Failed: res.StatusCode == conformanceStatusFailed, Body: body,
			Omitted: res.Header.Get(claimclient.HeaderBodyOmitted) == "true",
		}}
	}
	if res.Header.Get("Content-Type") == "application/problem+json" {
		var p struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(body, &p)
		detail += " " + p.Type
		if p.Type == claimclient.ProblemKeyReused {
			return entrytest.Answer{Outcome: entrytest.Rejected, Detail: detail}
		}
		return entrytest.Answer{Outcome: entrytest.Error, Detail: detail}
	}
	if res.StatusCode == http.StatusAccepted {
		var op struct {
			State durable.State `json:"state"`
		}
		if err := json.Unmarshal(body, &op); err != nil {
			return entrytest.Answer{Outcome: entrytest.Error, Detail: detail + " unreadable: " + err.Error()}
		}
		detail += " " + string(op.State)
		if op.State == durable.Uncertain {
			return entrytest.Answer{Outcome: entrytest.Uncertain, Detail: detail}
		}
		// Queued now, or queued before and running: the first request and
		// its duplicates get the same answer.
		return entrytest.Answer{Outcome: entrytest.Accepted, Detail: detail}
	}
	return entrytest.Answer{Outcome: entrytest.Error, Detail: detail}
}
