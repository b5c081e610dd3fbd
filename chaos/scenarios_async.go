package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimriver"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// recStore records, as the Claimer's callers see them, the writes a
// worker makes through the Claimer: grants (Handover, Adopt, and with
// claims set every Claim that acquired) and finishing writes (Complete and
// Fail, with their fenced refusals). It sits above the store the scenario
// got (the broken one under a negative control), so a write the store
// wrongly accepts is recorded as accepted. The River workers use it, and
// the entry-point families (scenarios_entry.go), whose answers reach no
// client of the suite's own.
type recStore struct {
	storeapi.Store[pgxTx]
	e *env
	// client is the client number the calls are recorded under.
	client int
	// claims records the acquisitions of Claim too.
	claims bool
	// bodyOf names a stored result in the history; nil: the hash of its
	// body.
	bodyOf func(durable.Result) string
	// noRenew makes Renew of a paused worker's token fail (a paused process
	// renews nothing): its lease then runs out by the database's clock.
	noRenew sync.Map // fence.Token → true
}

// InsertAtCommit is the store's: the workers recorded here do not use Do.
func (s *recStore) InsertAtCommit(ctx context.Context, p storeapi.ClaimParams, tok fence.Token, fn func(ctx context.Context, tx pgxTx) (durable.State, durable.Result, error)) error {
	return insertAtCommit(ctx, s.Store, p, tok, fn)
}

func (s *recStore) opOf(ref durable.Ref) (*op, int) {
	key, ok := s.e.keyspace[ref.KeyHash]
	if !ok {
		return nil, 0
	}
	for _, o := range s.e.ops {
		// The key alone is not the record: scenarios share the run's
		// table and tenant, each under its own operation.
		if o.key == key && o.ref.Tenant == ref.Tenant && o.ref.Operation == ref.Operation {
			epoch, _, _ := o.get()
			return o, epoch
		}
	}
	return nil, 0
}

// add records c for ref's operation, if it is one of the scenario's.
func (s *recStore) add(ref durable.Ref, c history.Call) {
	if o, epoch := s.opOf(ref); o != nil {
		c.Key, c.Epoch, c.Client, c.End = o.key, epoch, s.client, s.e.rec.Now()
		s.e.rec.Add(c)
	}
}

// Claim records an acquisition (or a claim whose answer was lost, which
// may have acquired) when claims is set.
func (s *recStore) Claim(ctx context.Context, tx pgxTx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	start := s.e.rec.Now()
	res, err := s.Store.Claim(ctx, tx, p)
	if !s.claims || tx != nil {
		return res, err
	}
	c := history.Call{Fingerprint: p.Fingerprint, Start: start, Token: res.Token}
	switch {
	case err == nil && res.Acquired:
		c.Kind = history.Acquire
	case err == nil, errors.Is(err, durable.ErrMismatch):
		return res, err
	default:
		c.Kind, c.Ambiguous, c.Note = history.Acquire, true, err.Error()
	}
	ref, rerr := s.Store.Ref(p.Scope)
	if rerr == nil {
		s.add(ref, c)
	}
	return res, err
}

func (s *recStore) Adopt(ctx context.Context, ref durable.Ref, owner uuid.UUID, proposed uint64, lease time.Duration) (fence.Token, error) {
	start := s.e.rec.Now()
	tok, err := s.Store.Adopt(ctx, ref, owner, proposed, lease)
	c := history.Call{Start: start, Note: "takeover"}
	switch {
	case err == nil:
		c.Kind, c.Token = history.Adopt, tok
	case errors.Is(err, durable.ErrBusy), errors.Is(err, durable.ErrNotFound):
		c.Kind = history.NoEffect
	default:
		c.Kind, c.Ambiguous = history.Adopt, true
	}
	s.add(ref, c)
	return tok, err
}

func (s *recStore) Handover(ctx context.Context, ref durable.Ref, from fence.Token, owner uuid.UUID, lease time.Duration) (fence.Token, error) {
	start := s.e.rec.Now()
	tok, err := s.Store.Handover(ctx, ref, from, owner, lease)
	c := history.Call{Start: start, Note: "handover to a worker"}
	switch {
	case err == nil:
		c.Kind, c.Token = history.Adopt, tok // a grant of a new generation
	case errors.Is(err, durable.ErrFenced):
		c.Kind = history.NoEffect
	default:
		c.Kind, c.Ambiguous = history.Adopt, true
	}
	s.add(ref, c)
	return tok, err
}

func (s *recStore) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	if _, paused := s.noRenew.Load(tok); paused {
		return fmt.Errorf("chaos: %w: the worker is paused", durable.ErrUnavailable)
	}
	return s.Store.Renew(ctx, ref, tok, lease)
}

func (s *recStore) Complete(ctx context.Context, tx pgxTx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	start := s.e.rec.Now()
	err := s.Store.Complete(ctx, tx, ref, tok, res)
	s.finished(ref, tok, res, start, err)
	return err
}

func (s *recStore) Fail(ctx context.Context, tx pgxTx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	start := s.e.rec.Now()
	err := s.Store.Fail(ctx, tx, ref, tok, res)
	s.finished(ref, tok, res, start, err)
	return err
}

// finished records a finishing write under tok that stored res.
func (s *recStore) finished(ref durable.Ref, tok fence.Token, res durable.Result, start time.Duration, err error) {
	body := history.Hash(res.Body)
	if s.bodyOf != nil {
		body = s.bodyOf(res)
	}
	c := history.Call{Token: tok, Body: body, Status: res.StatusCode, Start: start}
	switch {
	case err == nil:
		c.Kind = history.Complete
	case errors.Is(err, durable.ErrFenced):
		c.Kind, c.Note = history.Fenced, err.Error()
		s.e.observe("fenced-completion")
	default:
		c.Kind, c.Ambiguous, c.Note = history.Complete, true, err.Error()
	}
	s.add(ref, c)
}

// asyncWorkerClient is the client number of the River workers' calls.
const asyncWorkerClient = 3000

// riverWorkers is the scenario's pool of River clients ("worker
// processes"); a killed one is replaced.
type riverWorkers struct {
	e *env
	// tune, when set, adjusts the config of every client.
	tune    func(*river.Config)
	pool    *pgxpool.Pool
	workers *river.Workers
	mu      sync.Mutex
	byID    map[int]*river.Client[pgxTx]
	next    int
	insert  *river.Client[pgxTx] // inserts only
}

func (rw *riverWorkers) config(work bool) *river.Config {
	cfg := &river.Config{
		Schema: rw.e.schema, Workers: rw.workers, TestOnly: true,
		FetchCooldown: 10 * time.Millisecond, FetchPollInterval: 30 * time.Millisecond,
		RetryPolicy: asyncRetry{rw.e.cfg.Lease}, Logger: rw.e.log,
	}
	if work {
		cfg.Queues = map[string]river.QueueConfig{rw.queue(): {MaxWorkers: rw.e.cfg.Parallel}}
	}
	if rw.tune != nil {
		rw.tune(cfg)
	}
	return cfg
}

// queue is the River queue of the scenario's jobs, named after it: River's
// tables are in the run's schema, which every scenario of the run shares,
// so a job another scenario left behind (a retry scheduled after it ended)
// must not be worked by this one's workers, under this one's history.
func (rw *riverWorkers) queue() string { return rw.e.name }

// newRiverWorkers migrates River's tables into the scenario's schema and
// returns its (not yet started) worker processes, on a pool of their own.
func (e *env) newRiverWorkers(ctx context.Context) (*riverWorkers, error) {
	rpool, err := e.newPool(ctx, "")
	if err != nil {
		return nil, err
	}
	if m, err := rivermigrate.New(riverpgxv5.New(rpool), &rivermigrate.Config{Schema: e.schema}); err != nil {
		return nil, fmt.Errorf("%w: river: %w", ErrSetup, err)
	} else if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("%w: river migrate: %w", ErrSetup, err)
	}
	return &riverWorkers{e: e, pool: rpool, workers: river.NewWorkers(), byID: map[int]*river.Client[pgxTx]{}}, nil
}

// startAll registers r's worker, creates the client that only inserts,
// and starts n worker processes (stopped with the scenario).
func (rw *riverWorkers) startAll(ctx context.Context, r *claimriver.Runner[pgxTx], n int) error {
	if err := r.Register(rw.workers); err != nil {
		return err
	}
	var err error
	if rw.insert, err = river.NewClient(riverpgxv5.New(rw.pool), rw.config(false)); err != nil {
		return err
	}
	for range n {
		if err := rw.start(ctx); err != nil {
			return err
		}
	}
	rw.e.onClose(rw.stopAll)
	return nil
}

// start starts a new worker process.
func (rw *riverWorkers) start(ctx context.Context) error {
	cl, err := river.NewClient(riverpgxv5.New(rw.pool), rw.config(true))
	if err != nil {
		return err
	}
	if err := cl.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	rw.mu.Lock()
	rw.next++
	rw.byID[rw.next] = cl
	rw.mu.Unlock()
	return nil
}

// kill stops the worker process that runs the job with its context
// cancelled (the work stops where it is; its lease is left to expire), and
// starts a replacement.
func (rw *riverWorkers) kill(ctx context.Context, cl *river.Client[pgxTx]) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = cl.StopAndCancel(sctx)
	rw.mu.Lock()
	for id, c := range rw.byID {
		if c == cl {
			delete(rw.byID, id)
		}
	}
	rw.mu.Unlock()
	if err := rw.start(ctx); err == nil {
		rw.e.fault("worker-killed")
	}
}

func (rw *riverWorkers) stopAll() {
	rw.mu.Lock()
	cls := make([]*river.Client[pgxTx], 0, len(rw.byID))
	for _, c := range rw.byID {
		cls = append(cls, c)
	}
	rw.byID = map[int]*river.Client[pgxTx]{}
	rw.mu.Unlock()
	for _, c := range cls {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = c.StopAndCancel(ctx)
		cancel()
	}
}

// asyncRetry retries a failed attempt after a lease (River's default waits
// attempt^4 seconds).
type asyncRetry struct{ lease time.Duration }

func (p asyncRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(p.lease) }

// setupAsyncRiver runs every operation in async mode on River: clients
// enqueue (claim + job in one transaction) and retry until the result
// replays; River workers run the work under the lease, call the downstream
// with the operation identity and complete fenced. Workers are paused past
// their lease (River's rescuer then hands the job to another worker, which
// takes over under a new generation, and the paused worker's completion
// must be fenced) and killed mid-job (the retry takes over), and Redis is
// restarted empty.
func setupAsyncRiver(ctx context.Context, e *env) (*workload, error) {
	srv, err := redisproc.New(redisproc.Options{})
	if err != nil {
		return nil, err
	}
	e.onClose(srv.Close)
	base, err := e.store(storeOpts{})
	if err != nil {
		return nil, err
	}
	st := &recStore{Store: base, e: e, client: asyncWorkerClient}
	rdb := e.redisOwn(srv.Addr(), nil)
	c, err := e.claimer(claimerOpts{store: st, redis: rdb})
	if err != nil {
		return nil, err
	}
	verifier, err := e.claimer(claimerOpts{store: base, redis: e.redisOwn(srv.Addr(), nil)})
	if err != nil {
		return nil, err
	}
	w := e.newWorkload()
	w.claimers, w.verifier, w.modeOf = []*claim.Claimer[pgxTx]{c}, verifier, flowAll
	if err := e.withDownstream(w, nil); err != nil {
		return nil, err
	}
	rw, err := e.newRiverWorkers(ctx)
	if err != nil {
		return nil, err
	}
	e.expectFaults("worker-paused-past-lease", "taken-over-during-pause", "worker-killed", "redis-restarted-empty")

	var killing atomic.Int32
	runner, err := claimriver.New(c, func(ctx context.Context, job claimriver.Job) (durable.Result, error) {
		o := e.ops[job.OperationID]
		if o == nil {
			return durable.Result{}, errors.New("chaos: a job for an unknown operation")
		}
		epoch, _, _ := o.get()
		if job.Attempt == 1 {
			// The intent's grant was recorded by the client that enqueued.
			e.observe("first-attempt")
		}
		if o.take("kill") && job.Attempt == 1 {
			if cl, err := river.ClientFromContextSafely[pgxTx](ctx); err == nil && killing.Add(1) == 1 {
				go func() { defer killing.Add(-1); rw.kill(ctx, cl) }()
				<-ctx.Done() // killed mid-job, before any effect
				return durable.Result{}, ctx.Err()
			}
		}
		dctx, cancel := context.WithTimeout(ctx, w.downstreamTimeout)
		id, derr := fault.CallDownstream(dctx, e.httpc, w.downstream.URL(), job.OperationID, job.Token)
		cancel()
		if derr != nil {
			return durable.Result{}, derr // River retries; uncertain after the last attempt
		}
		if o.take("pause") {
			// Paused past the lease right after the effect: renewals stop,
			// River's rescuer hands the job on, another worker takes over.
			st.noRenew.Store(job.Token, true)
			e.fault("worker-paused-past-lease")
			e.bg(func() { e.rescueAfterLease(ctx, o, job) })
			if e.awaitTakeover(ctx, o, job.Token, 20*e.cfg.Lease) {
				e.fault("taken-over-during-pause")
			}
		}
		return resultOf(200, flowBody(o.key, epoch, id)), nil
	}, claimriver.WithMaxAttempts(25), claimriver.WithFinishTimeout(2*time.Second), claimriver.WithQueue(rw.queue()))
	if err != nil {
		return nil, err
	}
	if err := rw.startAll(ctx, runner, 2); err != nil {
		return nil, err
	}

	w.startOp = func(_ context.Context, o *op) {
		e.planned(o, "pause", 0.25, 1)
		e.planned(o, "kill", 0.15, 2)
		if e.planned(o, "restart", 0.1, 3) {
			e.bg(func() {
				if err := srv.Restart(); err == nil {
					e.fault("redis-restarted-empty")
				}
			})
		}
	}
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		return e.eachOp(ctx, ops, func(o *op) {
			if w.startOp != nil {
				w.startOp(ctx, o)
			}
			var wg sync.WaitGroup
			for cl := 0; cl < e.cfg.Clients; cl++ {
				wg.Go(func() { e.asyncClient(ctx, runner, rw.insert, c, o, cl) })
			}
			wg.Wait()
		})
	}
	return w, nil
}

// rescueAfterLease does for a paused worker's job what River's rescuer does
// for a stuck one (RescueStuckJobsAfter, checked every 30 s, fixed in
// River): once the paused lease ran out by the database's clock, the job is
// made available to the other workers.
func (e *env) rescueAfterLease(ctx context.Context, o *op, job claimriver.Job) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*e.cfg.Lease+5*time.Second)
	defer cancel()
	for rctx.Err() == nil {
		if _, _, live, err := e.leaseOf(rctx, o); err == nil && !live {
			break
		}
		sleep(rctx, e.cfg.Lease/5)
	}
	_, _ = e.admin.Exec(rctx, `UPDATE `+e.schema+`.river_job SET state = 'retryable', scheduled_at = now()
		WHERE args->>'operation_id' = $1 AND state = 'running'`, job.OperationID)
}

// asyncClient enqueues o until its stored result replays (or it gives up),
// recording every answer.
func (e *env) asyncClient(ctx context.Context, r *claimriver.Runner[pgxTx], ins *river.Client[pgxTx], c *claim.Claimer[pgxTx], o *op, client int) {
	epoch, _, _ := o.get()
	rnd := e.sched.rnd("jitter", o.i, epoch, client)
	deadline := time.Now().Add(60*e.cfg.Lease + 10*time.Second)
	for n := 0; ctx.Err() == nil && time.Now().Before(deadline); n++ {
		if e.enqueueOnce(ctx, r, ins, o, client) {
			return
		}
		sleep(ctx, max(e.cfg.Lease/2, e.backoff(n, rnd)))
	}
	e.observe("client-gave-up")
}

// enqueueOnce is one Enqueue of o by client, recorded; it reports a final
// answer (the stored result, or a mismatch).
func (e *env) enqueueOnce(ctx context.Context, r *claimriver.Runner[pgxTx], ins *river.Client[pgxTx], o *op, client int) bool {
	epoch, fp, _ := o.get()
	call := history.Call{Key: o.key, Epoch: epoch, Client: client, Fingerprint: fp, Start: e.rec.Now()}
	actx, cancel := context.WithTimeout(ctx, 4*e.cfg.Lease+2*time.Second)
	out, err := r.Enqueue(actx, ins, claim.Request{Scope: o.scope, Fingerprint: fp}, nil)
	cancel()
	call.End = e.rec.Now()
	final := false
	switch {
	case err == nil && out.Kind == claim.Acquired:
		call.Kind, call.Token, call.Note = history.Acquire, out.Lease.Token(), "enqueued"
		e.observe("enqueued")
	case err == nil && out.Kind == claim.Replayed:
		call.Kind, call.Body, call.Status = history.Replay, history.Hash(out.Result.Body), out.Result.StatusCode
		e.observe("replayed")
		final = true
	case err == nil:
		call.Kind, call.Note, call.Answer = history.NoEffect, out.Kind.String(), answerOf(out.Kind)
		e.observe("accepted-" + out.Kind.String())
	case errors.Is(err, claim.ErrMismatch):
		call.Kind = history.Mismatch
		final = true
	default:
		call.Kind, call.Ambiguous, call.Note = history.Acquire, true, err.Error()
		e.observe("error")
	}
	e.rec.Add(call)
	return final
}
