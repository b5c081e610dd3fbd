package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
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
)

// deployTime is how long a deploy takes.
const deployTime = 2 * time.Second

// downstream is the fake deployment system: it takes the operation
// identity as its idempotency key, so a deploy repeated after a crash is
// applied once.
type downstream struct {
	mu      sync.Mutex
	applied map[string]string // operation id → deploy id
	calls   atomic.Int64
}

// deploy applies the deploy of op (once) and returns its id.
func (d *downstream) deploy(op string) string {
	d.calls.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if id, ok := d.applied[op]; ok {
		return id
	}
	id := fmt.Sprintf("dep_%d", len(d.applied)+1)
	d.applied[op] = id
	return id
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
	a := &app[TTx]{c: c, q: q, down: &downstream{applied: map[string]string{}}, log: log, workers: river.NewWorkers()}
	a.runner, err = claimriver.New(c, a.work, claimriver.WithMaxAttempts(10))
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
	a.handler = demoauth.Middleware(mux)
	return a, nil
}

// work is the deploy: it takes deployTime, calls the downstream with the
// operation identity, and stores 201 with the deploy's location.
func (a *app[TTx]) work(ctx context.Context, job claimriver.Job) (durable.Result, error) {
	var in deployIn
	if err := json.Unmarshal(job.Payload, &in); err != nil || in.Service == "" || in.Version == "" {
		return durable.Result{}, claim.Reject(durable.Result{StatusCode: http.StatusBadRequest,
			Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"error":"service and version are required"}`)})
	}
	id := a.down.deploy(job.OperationID)
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
	body, _ := json.Marshal(map[string]string{"id": id, "service": in.Service, "version": in.Version, "status": "deployed"})
	return durable.Result{StatusCode: http.StatusCreated, Version: 1, ResourceID: id,
		Headers: map[string][]string{"Content-Type": {"application/json"}, "Location": {"/deploys/" + id}}, Body: body}, nil
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
	addr := o.addr
	if o.demo {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
	var serveErr error
	served := make(chan struct{})
	go func() {
		defer close(served)
		serveErr = srv.Serve(ln)
	}()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
	}()
	url := "http://" + ln.Addr().String()
	if o.demo {
		fmt.Fprintln(out, "deploys: demo against", url)
		return runDemo(ctx, url, a, out)
	}
	fmt.Fprintln(out, "deploys: listening on", url)
	select {
	case <-ctx.Done():
		return nil
	case <-served:
		return serveErr
	}
}
