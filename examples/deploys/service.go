package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/claim/claimriver"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/examples/internal/demoauth"
	"github.com/oncekey/oncekey/examples/internal/program"
)

// deployTime is how long a deploy takes.
const deployTime = 2 * time.Second

// downstream is the fake deployment system: it takes the operation
// identity as its idempotency key, so a deploy repeated after a crash is
// applied once.
type downstream struct {
	mu      sync.Mutex
	applied map[string]deployment // operation id → deploy
	calls   atomic.Int64
}

// deployment is one applied deploy, served at /deploys/{id} to its tenant.
type deployment struct {
	ID      string `json:"id"`
	Service string `json:"service"`
	Version string `json:"version"`
	Status  string `json:"status"`
	tenant  string
}

// deploy applies the deploy of op (once) and returns it.
func (d *downstream) deploy(tenant, op string, in deployIn) deployment {
	d.calls.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if dep, ok := d.applied[op]; ok {
		return dep
	}
	dep := deployment{ID: fmt.Sprintf("dep_%d", len(d.applied)+1), Service: in.Service, Version: in.Version, Status: "deployed", tenant: tenant}
	d.applied[op] = dep
	return dep
}

// find returns tenant's deploy id.
func (d *downstream) find(tenant, id string) (deployment, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dep := range d.applied {
		if dep.ID == id && dep.tenant == tenant {
			return dep, true
		}
	}
	return deployment{}, false
}

func (d *downstream) effects() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.applied)
}

// deployIn is the request body.
type deployIn struct {
	Service string `json:"service"`
	Version string `json:"version"`
}

// errInvalidDeploy is the refusal of a request whose body is not a deploy.
var errInvalidDeploy = errors.New(`send one JSON object with "service" and "version"`)

// parseDeploy reads a deploy request body.
func parseDeploy(body []byte) (deployIn, error) {
	var in deployIn
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil || dec.More() || in.Service == "" || in.Version == "" {
		return in, errInvalidDeploy
	}
	return in, nil
}

// validDeploy is the handler's check before the claim
// (claimriver.WithValidate): a body that is not a deploy is a 400 problem
// that reserves nothing, so the corrected request runs with the same key.
// Had the work refused it instead, the key would replay that refusal for
// its whole retention.
func validDeploy(_ *http.Request, body []byte) error {
	_, err := parseDeploy(body)
	return err
}

// app is the running service.
type app[TTx any] struct {
	c       *claim.Claimer[TTx]
	runner  *claimriver.Runner[TTx]
	q       queue[TTx]
	down    *downstream
	log     *slog.Logger
	handler http.Handler

	mu      sync.Mutex
	workers *river.Workers
	worker  *river.Client[TTx] // the running worker process
	// onDeploy, when set, runs in the worker after the downstream call
	// (the demo shuts the worker down there).
	onDeploy atomic.Pointer[func(ctx context.Context, op string)]
}

func newApp[TTx any](ctx context.Context, b *backend.Backend, q queue[TTx], log *slog.Logger) (*app[TTx], error) {
	if err := q.migrate(ctx); err != nil {
		return nil, fmt.Errorf("deploys: River's tables: %w", err)
	}
	c, err := claim.New(q.store, append(b.ClaimOptions(), claim.WithLease(2*time.Second), claim.WithLogger(log))...)
	if err != nil {
		return nil, err
	}
	a := &app[TTx]{c: c, q: q, down: &downstream{applied: map[string]deployment{}}, log: log, workers: river.NewWorkers()}
	a.runner, err = claimriver.New(c, a.work, claimriver.WithMaxAttempts(10), claimriver.WithValidate(validDeploy))
	if err != nil {
		return nil, err
	}
	if err := a.runner.Register(a.workers); err != nil {
		return nil, err
	}
	inserter, err := river.NewClient(q.driver, &river.Config{Workers: a.workers, Logger: log})
	if err != nil {
		return nil, err
	}
	deploys, err := a.runner.Handler(inserter, "POST /deploys", demoauth.Tenant)
	if err != nil {
		return nil, err
	}
	ops, err := claimhttp.Operations(c, demoauth.Tenant)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /deploys", deploys)
	mux.Handle("GET /operations/", ops)
	mux.HandleFunc("GET /deploys/{id}", a.get)
	a.handler = demoauth.Middleware(mux)
	return a, nil
}

// work is the deploy: it takes deployTime, calls the downstream with the
// operation identity, and stores 201 with the deploy's location.
func (a *app[TTx]) work(ctx context.Context, job claimriver.Job) (durable.Result, error) {
	in, err := parseDeploy(job.Payload)
	if err != nil {
		// The handler's validDeploy refused such bodies before the claim;
		// a job inserted by other means still fails for good.
		return durable.Result{}, claim.Reject(durable.Result{StatusCode: http.StatusBadRequest,
			Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"error":"service and version are required"}`)})
	}
	dep := a.down.deploy(job.Tenant, job.OperationID, in)
	if hook := a.onDeploy.Load(); hook != nil {
		(*hook)(ctx, job.OperationID)
	}
	select {
	case <-ctx.Done():
		// The lease was lost or could not be renewed, after the downstream
		// call: the outcome is uncertain (River's shutdown does not end ctx).
		return durable.Result{}, context.Cause(ctx)
	case <-time.After(deployTime):
	}
	body, _ := json.Marshal(dep)
	return durable.Result{StatusCode: http.StatusCreated, Version: 1, ResourceID: dep.ID,
		Headers: map[string][]string{"Content-Type": {"application/json"}, "Location": {"/deploys/" + dep.ID}}, Body: body}, nil
}

// get serves GET /deploys/{id}, the Location of a finished deploy: the
// caller's own deploys only (another tenant's is a 404, as an unknown one).
func (a *app[TTx]) get(w http.ResponseWriter, r *http.Request) {
	tenant, err := demoauth.Tenant(r)
	if err != nil {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	dep, ok := a.down.find(tenant, r.PathValue("id"))
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(dep)
}

// startWorker starts a worker process (a River client working the queue).
func (a *app[TTx]) startWorker(ctx context.Context) error {
	cfg := &river.Config{
		Workers: a.workers, Logger: a.log,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		FetchCooldown:     50 * time.Millisecond,
		FetchPollInterval: 200 * time.Millisecond,
		RetryPolicy:       quickRetry{},
	}
	// A worker that dies: its job is retried soon after its lease, not
	// after River's default hour.
	cfg.RescueStuckJobsAfter = a.runner.RescueStuckJobsAfter(cfg)
	cl, err := river.NewClient(a.q.driver, cfg)
	if err != nil {
		return err
	}
	if err := cl.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	a.mu.Lock()
	a.worker = cl
	a.mu.Unlock()
	return nil
}

// stopWorker stops the worker process, cancelling the work it runs.
func (a *app[TTx]) stopWorker(ctx context.Context) {
	a.mu.Lock()
	cl := a.worker
	a.worker = nil
	a.mu.Unlock()
	if cl != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = cl.StopAndCancel(sctx)
	}
}

// quickRetry retries a failed deploy after a second (River's default
// waits attempt^4 seconds).
type quickRetry struct{}

func (quickRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(time.Second) }

// serve runs the service until ctx is done, or, with -demo, the demo.
func serve[TTx any](ctx context.Context, o options, out io.Writer, log *slog.Logger, b *backend.Backend, q queue[TTx]) error {
	a, err := newApp(ctx, b, q, log)
	if err != nil {
		return err
	}
	if err := a.startWorker(ctx); err != nil {
		return err
	}
	defer a.stopWorker(ctx)
	// The sweeper deletes finished records past their retention, every
	// minute; nothing else does. It stops after the server, as in orders
	// and payments.
	stopSweep := program.Go(ctx, func(ctx context.Context) error { return a.c.RunSweeper(ctx, time.Minute) })
	defer stopSweep()
	addr := o.addr
	var demo func(url string) error
	if o.demo {
		addr = "127.0.0.1:0"
		demo = func(url string) error { return runDemo(ctx, url, a, out) }
	}
	return program.Serve(ctx, out, "deploys", addr, a.handler, "", demo)
}
