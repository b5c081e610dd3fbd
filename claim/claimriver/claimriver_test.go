package claimriver

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/durable"
)

func tenantOf(r *http.Request) (string, error) {
	if t := r.Header.Get("X-Tenant"); t != "" {
		return t, nil
	}
	return "", errors.New("unauthenticated")
}

func post(h http.Handler, tenant, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/deploys", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Tenant", tenant)
	r.Header.Set("Idempotency-Key", `"`+key+`"`)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// End to end on River: 202 + Location at once; a retry while it runs gets
// the same 202 and Location; the operation resource shows processing then
// completed; a retry after it finished replays the stored result; another
// payload under the key is 422; the downstream ran once.
func TestAsync_EndToEnd(t *testing.T) {
	t.Parallel()
	e := setup(t, 2*time.Second)
	release := make(chan struct{})
	e.setWork(func(ctx context.Context, job Job) (durable.Result, error) {
		<-release
		return e.deploy(ctx, job)
	})
	cl := e.client(true)
	h := e.handler(cl)
	ops := e.operations()
	const body = `{"service":"api","version":"1.2.3"}`
	first := post(h, "acme", "dep-1", body)
	loc := first.Header().Get("Location")
	if first.Code != http.StatusAccepted || !strings.HasPrefix(loc, "/operations/op_") || first.Header().Get("Retry-After") == "" {
		close(release)
		t.Fatalf("first = %d Location %q; want 202 /operations/op_...", first.Code, loc)
	}
	id := strings.TrimPrefix(loc, "/operations/")
	for range 3 {
		if w := post(h, "acme", "dep-1", body); w.Code != http.StatusAccepted || w.Header().Get("Location") != loc {
			close(release)
			t.Fatalf("retry while running = %d %q; want 202 %s", w.Code, w.Header().Get("Location"), loc)
		}
	}
	get := func(tenant string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, loc, nil)
		r.Header.Set("X-Tenant", tenant)
		w := httptest.NewRecorder()
		ops.ServeHTTP(w, r)
		return w
	}
	if w := get("acme"); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"state":"processing"`) {
		close(release)
		t.Fatalf("operation while running: %d %s", w.Code, w.Body)
	}
	if w := get("globex"); w.Code != http.StatusNotFound {
		t.Errorf("another tenant's GET = %d; want 404", w.Code)
	}
	close(release)
	e.waitState("acme", id, durable.Completed)
	if w := get("acme"); !strings.Contains(w.Body.String(), `"state":"completed"`) || !strings.Contains(w.Body.String(), `"location":"/deploys/`+id+`"`) {
		t.Fatalf("operation once completed: %s", w.Body)
	}
	rep := post(h, "acme", "dep-1", body)
	if rep.Code != http.StatusCreated || rep.Header().Get("Idempotent-Replayed") != "true" || !strings.Contains(rep.Body.String(), `"deployed":true`) {
		t.Fatalf("retry after completion = %d %s; want the stored 201", rep.Code, rep.Body)
	}
	if w := post(h, "acme", "dep-1", `{"service":"api","version":"9.9.9"}`); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("another payload under the key = %d; want 422", w.Code)
	}
	if n := e.calls.Load(); n != 1 || e.effects(id) != 1 || e.jobs() != 1 {
		t.Fatalf("downstream calls %d, effects %d, jobs %d; want 1, 1, 1", n, e.effects(id), e.jobs())
	}
}

// A burst of concurrent duplicates inserts one job and gets one Location.
func TestAsync_ConcurrentBurstIsOneJob(t *testing.T) {
	t.Parallel()
	e := setup(t, 5*time.Second)
	cl := e.client(false) // inserts only: nothing works the job
	h := e.handler(cl)
	const n = 20
	locs := make([]string, n)
	codes := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			w := post(h, "acme", "burst", `{"v":1}`)
			codes[i], locs[i] = w.Code, w.Header().Get("Location")
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if codes[i] != http.StatusAccepted || locs[i] != locs[0] || locs[0] == "" {
			t.Fatalf("request %d = %d %q; want 202 %q", i, codes[i], locs[i], locs[0])
		}
	}
	if j := e.jobs(); j != 1 {
		t.Fatalf("%d jobs for one key; want 1", j)
	}
}

// job builds the River job of an attempt, as River hands it to the worker.
func job(args Args, attempt, maxAttempts int) *river.Job[Args] {
	return &river.Job[Args]{JobRow: &rivertype.JobRow{ID: 1, Attempt: attempt, MaxAttempts: maxAttempts, Kind: Kind}, Args: args}
}

// enqueued claims a key and inserts its job (not worked), returning its
// arguments as the worker will get them.
func (e *env) enqueued(key string) Args {
	e.t.Helper()
	cl := e.client(false)
	out, err := e.runner.Enqueue(e.t.Context(), cl, claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /deploys", Key: key}, Fingerprint: "v1:x"}, []byte(`{}`))
	if err != nil || out.Kind != claim.Acquired {
		e.t.Fatalf("Enqueue = %v, %v", out.Kind, err)
	}
	var a Args
	var raw []byte
	if err := e.schema.Pool.QueryRow(e.t.Context(), `SELECT args FROM `+e.schema.Name+`.river_job WHERE args->>'operation_id' = $1`, out.OperationID).Scan(&raw); err != nil {
		e.t.Fatal(err)
	}
	if strings.Contains(string(raw), key) {
		e.t.Fatalf("the job's arguments hold the raw key: %s", raw)
	}
	a.OperationID, a.Tenant = out.OperationID, "acme"
	tok := out.Lease.Token()
	a.Generation, a.Owner = tok.Generation, tok.Owner
	return a
}

// expire ends the current lease of the operation now, by the database's
// clock, as if its worker had died or paused past it.
func (e *env) expire(id string) {
	e.t.Helper()
	rec := e.record("acme", id)
	if _, err := e.schema.Pool.Exec(e.t.Context(), `UPDATE `+e.schema.Name+`.idempotency_requests
		SET lease_expires_at = clock_timestamp() - interval '1 second'
		WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3`, rec.Ref.Tenant, rec.Ref.Operation, rec.Ref.KeyHash[:]); err != nil {
		e.t.Fatal(err)
	}
}

// A stale worker (attempt 1, paused past its lease while attempt 2 took
// the operation over under a new generation) has its completion fenced:
// attempt 2's result is the one stored, and the stale attempt reports
// success to River without writing.
func TestAsync_StaleWorkerCompletionIsFenced(t *testing.T) {
	t.Parallel()
	e := setup(t, 600*time.Millisecond)
	a := e.enqueued("stale")
	w := &worker[pgx.Tx]{r: e.runner}
	started, resume := make(chan struct{}), make(chan struct{})
	e.setWork(func(ctx context.Context, j Job) (durable.Result, error) {
		if j.Attempt == 1 {
			close(started)
			<-resume // paused: it ignores its context, as a stalled process would
			return durable.Result{StatusCode: 201, Body: []byte(`{"by":"stale"}`)}, nil
		}
		return durable.Result{StatusCode: 201, Body: []byte(`{"by":"attempt 2"}`)}, nil
	})
	staleErr := make(chan error, 1)
	go func() { staleErr <- w.Work(context.Background(), job(a, 1, 3)) }()
	<-started
	// Attempt 2 takes over once the lease is expired (attempt 1's keep-alive
	// may renew it in between: expire again and retry).
	deadline := time.Now().Add(20 * time.Second)
	for {
		e.expire(a.OperationID)
		err := w.Work(context.Background(), job(a, 2, 3))
		if err == nil {
			break
		}
		var snooze *river.JobSnoozeError
		if !errors.As(err, &snooze) || time.Now().After(deadline) {
			close(resume)
			t.Fatalf("attempt 2: %v", err)
		}
	}
	rec := e.record("acme", a.OperationID)
	if rec.State != durable.Completed || string(rec.Result.Body) != `{"by":"attempt 2"}` || rec.Token.Generation <= a.Generation {
		close(resume)
		t.Fatalf("after attempt 2: %v %s generation %d (first %d)", rec.State, rec.Result.Body, rec.Token.Generation, a.Generation)
	}
	close(resume)
	if err := <-staleErr; err != nil {
		t.Fatalf("stale attempt returned %v; want nil (fenced, nothing written)", err)
	}
	if got := e.record("acme", a.OperationID); string(got.Result.Body) != `{"by":"attempt 2"}` || got.Token != rec.Token {
		t.Fatalf("the stale completion overwrote the result: %s", got.Result.Body)
	}
}

// A tenant no record can have (not valid UTF-8, a control character):
// the handler answers 401 as without a tenant, inserting nothing (it
// answered 400 "key invalid" before), and the operation resource 404 as
// for an unknown operation (500 before, issue 27 #8).
func TestAsync_InvalidTenant(t *testing.T) {
	t.Parallel()
	e := setup(t, 2*time.Second)
	cl := e.client(false)
	h := e.handler(cl)
	ops := e.operations()
	const body = `{"service":"api","version":"1.2.3"}`
	first := post(h, "acme", "dep-bad-tenant", body)
	loc := first.Header().Get("Location")
	if first.Code != http.StatusAccepted || !strings.HasPrefix(loc, "/operations/op_") {
		t.Fatalf("first = %d Location %q; want 202 /operations/op_...", first.Code, loc)
	}
	get := func(tenant, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("X-Tenant", tenant)
		w := httptest.NewRecorder()
		ops.ServeHTTP(w, r)
		return w
	}
	unknown := get("acme", "/operations/op_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	if unknown.Code != http.StatusNotFound {
		t.Fatalf("unknown operation = %d %s; want 404", unknown.Code, unknown.Body)
	}
	for _, tenant := range []string{"acme\xff", "ac\x01me"} {
		if w := post(h, tenant, "dep-bad-tenant-2", body); w.Code != http.StatusUnauthorized ||
			!strings.Contains(w.Body.String(), claimclient.ProblemUnidentified) {
			t.Errorf("POST with tenant %q = %d %s; want 401 %s", tenant, w.Code, w.Body, claimclient.ProblemUnidentified)
		}
		if w := get(tenant, loc); w.Code != http.StatusNotFound || w.Body.String() != unknown.Body.String() {
			t.Errorf("GET with tenant %q = %d %s; want the 404 of an unknown operation %s", tenant, w.Code, w.Body, unknown.Body)
		}
	}
	if n := e.jobs(); n != 1 {
		t.Fatalf("jobs = %d; want 1 (nothing inserted for a bad tenant)", n)
	}
}

// A result in another adapter's format (a gRPC reply, as a resolve for the
// wrong adapter would write) is never replayed by the Handler as a
// success: 500, not a 200 with the protobuf bytes.
func TestAsync_ForeignFormatIsNotReplayedAsSuccess(t *testing.T) {
	t.Parallel()
	e := setup(t, 2*time.Second)
	e.setAnswer(durable.Result{StatusCode: 0, Body: []byte{0x0a, 0x02, 'o', 'k'}, Version: 1001}, nil)
	cl := e.client(true)
	h := e.handler(cl)
	const body = `{"service":"api","version":"1"}`
	first := post(h, "acme", "dep-grpc", body)
	if first.Code != http.StatusAccepted {
		t.Fatalf("first = %d; want 202", first.Code)
	}
	e.waitState("acme", strings.TrimPrefix(first.Header().Get("Location"), "/operations/"), durable.Completed)
	rep := post(h, "acme", "dep-grpc", body)
	if rep.Code != http.StatusInternalServerError || strings.Contains(rep.Body.String(), "ok") {
		t.Fatalf("replay of a gRPC-format result = %d %q; want a 500 problem", rep.Code, rep.Body)
	}
	if n := e.calls.Load(); n != 1 {
		t.Fatalf("work ran %d times; want 1", n)
	}
}
