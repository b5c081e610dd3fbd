package claimriver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
)

const childEnv = "CLAIMRIVER_TEST_CHILD" // "URL schema": run as the worker process to be killed (TestMain, main_test.go)

// runChild is a worker process: a River client whose work makes the
// downstream call (idempotent by operation identity) and then hangs until
// the process is killed.
func runChild(v string) {
	var url, schema, mode string
	if _, err := fmt.Sscan(v, &url, &schema); err != nil {
		panic(err)
	}
	if f := strings.Fields(v); len(f) > 2 {
		mode = f[2] // "steps": run the first two of stepNames, then hang
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	st, err := postgres.New(pool, postgres.WithSchema(schema))
	if err != nil {
		panic(err)
	}
	c, err := claim.New[pgx.Tx](st, claim.WithLease(time.Second))
	if err != nil {
		panic(err)
	}
	r, err := New(c, func(ctx context.Context, job Job) (durable.Result, error) {
		if mode == "steps" {
			for _, name := range stepNames[:2] {
				if _, err := Step(ctx, name, stepEffect(pool, schema, job)); err != nil {
					panic(err)
				}
			}
			select {} // killed here, after two of four steps
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.effects (op, attempt) VALUES ($1, $2) ON CONFLICT (op) DO NOTHING`, job.OperationID, job.Attempt); err != nil {
			panic(err)
		}
		select {} // killed here, mid-job
	})
	if err != nil {
		panic(err)
	}
	workers := river.NewWorkers()
	if err := r.Register(workers); err != nil {
		panic(err)
	}
	cl, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema: schema, Workers: workers, FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
	})
	if err != nil {
		panic(err)
	}
	if err := cl.Start(ctx); err != nil {
		panic(err)
	}
	select {}
}

// A worker process killed (SIGKILL) mid-job: River's own stuck-job rescuer,
// configured with Runner.RescueStuckJobsAfter (the lease, raised to
// JobTimeout: 1s here), schedules the job's retry, which takes the
// operation over under a new generation once the dead worker's lease
// expired and finishes it exactly once (one downstream effect). The rescuer
// looks every 30 s, on the client that leads once the dead one's leadership
// lapsed; the test waits for as long as two minutes and asserts no speed.
// With River's default (1 hour) the job stayed running long after the
// lease: this test gave up.
func TestAsync_WorkerKilledMidJobIsFinishedByTheRetry(t *testing.T) {
	t.Parallel()
	e := setup(t, time.Second)
	a := e.enqueued("killed")
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+e.schema.URL+" "+e.schema.Name)
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for e.effects(a.OperationID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the child worker never started the job")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	// The killed worker held the claim by handover: one generation above
	// the intent's.
	killed := e.record("acme", a.OperationID)
	if killed.State != durable.Processing || killed.Token.Generation != a.Generation+1 {
		t.Fatalf("after the kill: %v generation %d (intent %d)", killed.State, killed.Token.Generation, a.Generation)
	}
	e.clientWith(true, func(cfg *river.Config) {
		cfg.JobTimeout = time.Second
		cfg.RescueStuckJobsAfter = e.runner.RescueStuckJobsAfter(cfg)
	})
	rec := e.waitStateFor("acme", a.OperationID, durable.Completed, 2*time.Minute)
	if rec.Token.Generation <= killed.Token.Generation || rec.Takeovers < 1 {
		t.Fatalf("finished under generation %d (the killed worker's %d), %d takeovers; want a takeover", rec.Token.Generation, killed.Token.Generation, rec.Takeovers)
	}
	e.waitJob(a.OperationID, "completed")
	if n := e.effects(a.OperationID); n != 1 {
		t.Fatalf("%d downstream effects; want 1", n)
	}
	if e.calls.Load() != 1 {
		t.Fatalf("the retry called the downstream %d times; want 1", e.calls.Load())
	}
}

var stepNames = []string{"reserve", "charge", "receipt", "publish"}

// stepEffect is a step's downstream call: a row keyed by the step's key, so
// a second run of a step fails on the primary key (and is counted apart).
func stepEffect(pool *pgxpool.Pool, schema string, job Job) func(ctx context.Context, key string) ([]byte, error) {
	return func(ctx context.Context, key string) ([]byte, error) {
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.effects (op, attempt) VALUES ($1, $2)`, key, job.Attempt); err != nil {
			return nil, err
		}
		return []byte(key), nil
	}
}

// A worker process killed after two of four steps: River's retry takes the
// operation over and resumes, running the third and fourth steps only.
// Every step's effect happens once, the first two by the killed worker's
// attempt (issue 46).
func TestAsync_WorkerKilledAfterTwoStepsResumesAtTheThird(t *testing.T) {
	t.Parallel()
	e := setup(t, time.Second)
	e.setWork(func(ctx context.Context, job Job) (durable.Result, error) {
		for _, name := range stepNames {
			if _, err := Step(ctx, name, stepEffect(e.schema.Pool, e.schema.Name, job)); err != nil {
				return durable.Result{}, err
			}
		}
		return durable.Result{StatusCode: 200, Body: []byte("{}")}, nil
	})
	a := e.enqueued("killed-steps")
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+e.schema.URL+" "+e.schema.Name+" steps")
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	stepRows := func() map[string]int {
		rows, err := e.schema.Pool.Query(t.Context(), `SELECT op, attempt FROM `+e.schema.Name+`.effects WHERE op LIKE $1`, a.OperationID+"/%")
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
			op      string
			attempt int
		}, error) {
			var v struct {
				op      string
				attempt int
			}
			return v, r.Scan(&v.op, &v.attempt)
		})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int{}
		for _, v := range got {
			m[strings.TrimPrefix(v.op, a.OperationID+"/")] = v.attempt
		}
		return m
	}
	finished := func() int { // the steps recorded finished (the schema holds this one operation)
		var n int
		if err := e.schema.Pool.QueryRow(t.Context(), `SELECT count(*) FROM `+e.schema.Name+`.idempotency_requests_steps
			WHERE state = 'finished'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for finished() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the child worker never recorded its two steps")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	e.clientWith(true, func(cfg *river.Config) {
		cfg.JobTimeout = time.Second
		cfg.RescueStuckJobsAfter = e.runner.RescueStuckJobsAfter(cfg)
	})
	e.waitStateFor("acme", a.OperationID, durable.Completed, 2*time.Minute)
	got := stepRows()
	if len(got) != 4 || got["reserve"] != 1 || got["charge"] != 1 || got["receipt"] < 2 || got["publish"] != got["receipt"] {
		t.Fatalf("step effects by attempt = %v; want reserve and charge by attempt 1 only, receipt and publish once by the retry", got)
	}
}
