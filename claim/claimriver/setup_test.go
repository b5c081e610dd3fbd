package claimriver

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/settletest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// env is a Claimer on a fresh schema with River's tables in it, and a fake
// downstream that deduplicates by operation identity (an effects table keyed
// by it) and counts every call.
type env struct {
	t      *testing.T
	schema testenv.Schema
	c      *claim.Claimer[pgx.Tx]
	runner *Runner[pgx.Tx]
	calls  atomic.Int64
	work   atomic.Pointer[Work]
}

func setup(t *testing.T, lease time.Duration, opts ...Option) *env {
	t.Helper()
	return setupVia(t, lease, nil, opts...)
}

// setupVia is setup with the runner's Claimer on a pool through proxy (the
// tests' reads, River and the downstream use the direct pool), when proxy
// is not nil.
func setupVia(t *testing.T, lease time.Duration, proxy *pgproxy.Cutter, opts ...Option) *env {
	t.Helper()
	ctx := t.Context()
	s, st := settletest.Store(t, "effects (op text PRIMARY KEY, attempt int NOT NULL)")
	m, err := rivermigrate.New(riverpgxv5.New(s.Pool), &rivermigrate.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	c, err := claim.New[pgx.Tx](st, claim.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, schema: s, c: c}
	rc := c
	if proxy != nil {
		cfg, err := pgxpool.ParseConfig(s.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", proxy.Port()
		cfg.ConnConfig.Fallbacks = nil
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pst, err := postgres.New(pool, postgres.WithSchema(s.Name))
		if err != nil {
			t.Fatal(err)
		}
		if rc, err = claim.New[pgx.Tx](pst, claim.WithLease(lease)); err != nil {
			t.Fatal(err)
		}
	}
	e.runner, err = New(rc, func(ctx context.Context, job Job) (durable.Result, error) {
		if w := e.work.Load(); w != nil {
			return (*w)(ctx, job)
		}
		return e.deploy(ctx, job)
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// deploy is the default work: one idempotent downstream call keyed by the
// operation identity.
func (e *env) deploy(ctx context.Context, job Job) (durable.Result, error) {
	e.calls.Add(1)
	if _, err := e.schema.Pool.Exec(ctx, `INSERT INTO `+e.schema.Name+`.effects (op, attempt) VALUES ($1, $2)
		ON CONFLICT (op) DO NOTHING`, job.OperationID, job.Attempt); err != nil {
		return durable.Result{}, err
	}
	return durable.Result{StatusCode: http.StatusCreated, Headers: map[string][]string{
		"Location": {"/deploys/" + job.OperationID}, "Content-Type": {"application/json"},
	}, Body: []byte(`{"deployed":true,"attempt":` + itoa(job.Attempt) + `}`)}, nil
}

func itoa(n int) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

func (e *env) setWork(w Work) { e.work.Store(&w) }

// setAnswer sets a work that counts each run in e.calls and returns res
// and err, with no downstream call.
func (e *env) setAnswer(res durable.Result, err error) {
	e.setWork(func(context.Context, Job) (durable.Result, error) {
		e.calls.Add(1)
		return res, err
	})
}

func (e *env) effects(op string) int {
	var n int
	if err := e.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.schema.Name+`.effects WHERE op = $1`, op).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) jobs() int {
	var n int
	if err := e.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.schema.Name+`.river_job`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// client returns a River client (not started) working the runner's jobs.
func (e *env) client(start bool) *river.Client[pgx.Tx] {
	e.t.Helper()
	return e.clientWith(start, nil)
}

// handler returns the runner's Handler of "POST /deploys" (tenant from
// X-Tenant), inserting its jobs through cl.
func (e *env) handler(cl *river.Client[pgx.Tx]) http.Handler {
	e.t.Helper()
	h, err := e.runner.Handler(cl, "POST /deploys", tenantOf)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// operations returns the operation resource (claimhttp.Operations) of
// the env's Claimer.
func (e *env) operations() http.Handler {
	e.t.Helper()
	ops, err := claimhttp.Operations(e.c, tenantOf)
	if err != nil {
		e.t.Fatal(err)
	}
	return ops
}

// clientWith is client with tune applied to River's configuration first.
func (e *env) clientWith(start bool, tune func(*river.Config)) *river.Client[pgx.Tx] {
	e.t.Helper()
	workers := river.NewWorkers()
	if err := e.runner.Register(workers); err != nil {
		e.t.Fatal(err)
	}
	cfg := &river.Config{
		Schema:            e.schema.Name,
		Workers:           workers,
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		TestOnly:          true,
		RetryPolicy:       fastRetry{},
	}
	if start {
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}
	}
	if tune != nil {
		tune(cfg)
	}
	cl, err := river.NewClient(riverpgxv5.New(e.schema.Pool), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if start {
		if err := cl.Start(e.t.Context()); err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = cl.StopAndCancel(ctx)
		})
	}
	return cl
}

// fastRetry retries a failed attempt after 100ms (River's default waits
// attempt^4 seconds).
type fastRetry struct{}

func (fastRetry) NextRetry(*rivertype.JobRow) time.Time {
	return time.Now().Add(100 * time.Millisecond)
}

func (e *env) record(tenant, id string) durable.Record {
	e.t.Helper()
	rec, err := e.c.Operation(context.Background(), tenant, id)
	if err != nil {
		e.t.Fatalf("Operation: %v", err)
	}
	return rec
}

func (e *env) waitState(tenant, id string, want durable.State) durable.Record {
	e.t.Helper()
	return e.waitStateFor(tenant, id, want, 30*time.Second)
}

func (e *env) waitStateFor(tenant, id string, want durable.State, limit time.Duration) durable.Record {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		rec := e.record(tenant, id)
		if rec.State == want {
			return rec
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("gave up waiting for %s: %+v", want, rec)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
