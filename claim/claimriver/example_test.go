package claimriver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/claim/claimriver"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// POST /deploys in async mode: the handler checks the body, claims the key
// and inserts a River job in one transaction, and answers 202 with the
// operation's Location at once; a River worker runs the deploy and stores
// its answer, which a retry with the key gets, replayed. A body the check
// refuses reserves nothing, so the corrected body runs with the same key.
// River's tables and oncekey's live in the example's own schema (the
// pool's search_path), both created by their migrations.
func ExampleRunner_Handler() {
	pool, _, _, cleanup := testenv.Example() // a fresh schema on the test server
	defer cleanup()
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil) // River's tables, in the same schema
	if err != nil {
		panic(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		panic(err)
	}
	store, err := postgres.New(pool)
	if err != nil {
		panic(err)
	}
	claimer, err := claim.New[pgx.Tx](store)
	if err != nil {
		panic(err)
	}

	type deploy struct{ Service, Version string }
	work := func(ctx context.Context, job claimriver.Job) (durable.Result, error) {
		var d deploy
		_ = json.Unmarshal(job.Payload, &d)
		// Call the deployment system here, with job.OperationID as its
		// idempotency key.
		return durable.Result{StatusCode: http.StatusCreated, Version: 1,
			Headers: map[string][]string{"Content-Type": {"application/json"}},
			Body:    []byte(fmt.Sprintf(`{"service":%q,"version":%q,"status":"deployed"}`, d.Service, d.Version))}, nil
	}
	validate := func(_ *http.Request, body []byte) error {
		var d deploy
		if json.Unmarshal(body, &d) != nil || d.Service == "" || d.Version == "" {
			return errors.New("service and version are required")
		}
		return nil
	}
	runner, err := claimriver.New(claimer, work, claimriver.WithValidate(validate))
	if err != nil {
		panic(err)
	}
	workers := river.NewWorkers()
	if err := runner.Register(workers); err != nil {
		panic(err)
	}
	cfg := &river.Config{Workers: workers, Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		FetchCooldown: 50 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond}
	cfg.RescueStuckJobsAfter = runner.RescueStuckJobsAfter(cfg)
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	// The tenant comes from authentication; here a fixed one.
	tenant := func(r *http.Request) (string, error) { return "tenant-42", nil }
	deploys, err := runner.Handler(client, "POST /deploys", tenant)
	if err != nil {
		panic(err)
	}
	operations, err := claimhttp.Operations(claimer, tenant)
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /deploys", deploys)
	mux.Handle("GET /operations/", operations)

	send := func(method, path, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		if method == http.MethodPost {
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", `"1f7c2a52-2d0e-4d8e-9a51-0c1f3c0e9b7a"`)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	bad := send(http.MethodPost, "/deploys", `{"service":"api"}`)
	fmt.Println(bad.Code, strings.TrimSpace(bad.Body.String()))

	first := send(http.MethodPost, "/deploys", `{"service":"api","version":"1.4.2"}`)
	loc := first.Header().Get("Location")
	fmt.Println(first.Code, strings.HasPrefix(loc, "/operations/op_"))

	var op struct{ State string }
	for deadline := time.Now().Add(30 * time.Second); op.State != "completed" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_ = json.Unmarshal(send(http.MethodGet, loc, "").Body.Bytes(), &op)
	}
	fmt.Println("operation:", op.State)

	again := send(http.MethodPost, "/deploys", `{"service":"api","version":"1.4.2"}`)
	fmt.Println(again.Code, again.Header().Get("Idempotent-Replayed"), again.Body.String())
	// Output:
	// 400 {"type":"https://oncekey.dev/problems/body-invalid","title":"Request body invalid","status":400,"detail":"service and version are required"}
	// 202 true
	// operation: completed
	// 201 true {"service":"api","version":"1.4.2","status":"deployed"}
}
