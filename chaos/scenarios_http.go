package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/fence"
)

// The HTTP scenarios run the service side with claimhttp's middleware and
// the clients with claimhttp's retrying Transport. The server records what
// it executed (it knows the token); each client records the answer it
// finally got (a replay of the stored result, as far as the checker is
// concerned: it only saw a body).

// service is the suite's HTTP service in front of a Claimer.
type service struct {
	e       *env
	srv     *http.Server
	ln      net.Listener
	flow    bool
	d       *fault.Downstream
	dTime   time.Duration
	clients []*http.Client
	budget  *claimclient.RetryBudget

	requests atomic.Int64 // requests that reached the server
	logical  atomic.Int64 // requests the clients made (before their transports' retries)
	started  time.Time

	// Hooks of the scenarios that need them (scenarios_edge.go); nil in
	// the others.
	//
	// handler replaces the business handler behind the middleware.
	handler http.Handler
	// onRequest runs when a request of o reaches the server, before the
	// middleware.
	onRequest func(o *op)
	// requestCtx derives the context of one request of client c for o (a
	// client that disconnects or gives up); the returned cancel is called
	// when the attempt ends.
	requestCtx func(ctx context.Context, o *op, c int) (context.Context, context.CancelFunc)
}

// serviceOption adjusts a service before it starts and returns further
// options of its middleware.
type serviceOption func(s *service) []claimhttp.Option

// serverRec is what the guarded handler did, handed to the outer wrapper.
type serverRec struct {
	start  time.Duration
	ran    bool
	tok    fence.Token
	body   []byte
	status int
}

type recKey struct{}

func (e *env) newService(ctx context.Context, c *claim.Claimer[pgxTx], flow bool, d *fault.Downstream, opts ...serviceOption) (*service, error) {
	s := &service{e: e, flow: flow, d: d, dTime: e.cfg.Lease / 2, started: time.Now()}
	tenant := func(*http.Request) (string, error) { return e.tenant, nil } // the suite's one authenticated caller
	mo := []claimhttp.Option{
		claimhttp.WithOperation(func(*http.Request) string { return e.name }),
		claimhttp.WithLogger(e.log),
	}
	if !flow {
		mo = append(mo, claimhttp.WithInTransaction())
	}
	for _, opt := range opts {
		mo = append(mo, opt(s)...)
	}
	mw, err := claimhttp.Middleware(c, tenant, mo...)
	if err != nil {
		return nil, fmt.Errorf("%w: middleware: %w", ErrSetup, err)
	}
	mux := http.NewServeMux()
	h := http.Handler(http.HandlerFunc(s.handle))
	if s.handler != nil {
		h = s.handler
	}
	mux.Handle("POST /ops", s.outer(mw(h)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%w: listen: %w", ErrSetup, err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	e.onClose(func() { _ = s.srv.Close() })
	s.budget, err = claimclient.NewRetryBudget()
	if err != nil {
		return nil, err
	}
	for i := 0; i < e.cfg.Clients; i++ {
		tr, err := claimclient.NewTransport(&http.Transport{MaxIdleConnsPerHost: 16},
			claimclient.WithMaxAttempts(6), claimclient.WithBaseDelay(e.cfg.Lease/10), claimclient.WithMaxDelay(e.cfg.Lease),
			claimclient.WithMaxRetryAfter(3*e.cfg.Lease), claimclient.WithBudget(s.budget))
		if err != nil {
			return nil, err
		}
		s.clients = append(s.clients, &http.Client{Transport: tr})
	}
	return s, nil
}

func (s *service) url() string { return "http://" + s.ln.Addr().String() + "/ops" }

func (s *service) op(r *http.Request) *op {
	key, err := strconv.Unquote(r.Header.Get("Idempotency-Key")) // sent quoted by attempt
	if err != nil {
		return nil
	}
	return s.e.byKey[key]
}

// outer records what the server did with each request, and loses the
// response of the requests planned to lose it: the result is committed
// (the middleware publishes a response only once its result is durable),
// then the connection is closed before the client reads a byte.
func (s *service) outer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		e := s.e
		o := s.op(r)
		if o == nil {
			next.ServeHTTP(w, r)
			return
		}
		if s.onRequest != nil {
			s.onRequest(o)
		}
		sr := &serverRec{}
		r = r.WithContext(context.WithValue(r.Context(), recKey{}, sr))
		start := e.rec.Now()
		sr.start = start
		drop := o.take("drop")
		tw := &teeWriter{ResponseWriter: w, discard: drop, header: http.Header{}}
		next.ServeHTTP(tw, r)
		end := e.rec.Now()
		switch {
		case sr.ran && tw.status == http.StatusAccepted && bytes.Contains(tw.body.Bytes(), []byte(claimclient.ProblemUncertain)):
			// This request's own handler ran and marked its outcome
			// uncertain (its downstream call failed).
			e.observe("http-202-uncertain")
		case sr.ran && tw.status == http.StatusAccepted:
			// This request's own handler ran and it was answered 202: its
			// outcome was not recorded within FinishTimeout (pending), as
			// opposed to a duplicate told the work is in progress.
			e.observe("http-202-pending")
		}
		if sr.ran {
			epoch, fp, _ := o.get()
			call := history.Call{Key: o.key, Epoch: epoch, Client: 2000, Token: sr.tok, Fingerprint: fp, Body: history.Hash(sr.body),
				Status: sr.status, Start: start, End: end}
			published := tw.status == sr.status && bytes.Equal(tw.body.Bytes(), sr.body) && tw.header.Get(claimclient.HeaderReplayed) == ""
			switch {
			case sr.status >= 500 && published:
				call.Kind, call.Note = history.NoEffect, "released"
			case published && s.flow:
				call.Kind = history.Complete
			case published:
				call.Kind = history.Execute
			case s.flow:
				call.Kind, call.Ambiguous, call.Note = history.Complete, true, fmt.Sprintf("handler answered %d, the client got %d", sr.status, tw.status)
			default:
				call.Kind, call.Ambiguous, call.Note = history.Execute, true, fmt.Sprintf("handler answered %d, the client got %d", sr.status, tw.status)
			}
			if sr.status >= 500 && !published {
				call.Kind, call.Ambiguous, call.Note = history.NoEffect, false, "released"
			}
			e.rec.Add(call)
		}
		if drop {
			e.fault("http-response-dropped")
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
				}
			}
		}
	})
}

// teeWriter passes a response through (or discards it) and keeps a copy.
type teeWriter struct {
	http.ResponseWriter
	discard bool
	header  http.Header
	status  int
	body    bytes.Buffer
}

func (t *teeWriter) Header() http.Header {
	if t.discard {
		return t.header
	}
	return t.ResponseWriter.Header()
}

func (t *teeWriter) WriteHeader(code int) {
	if t.status == 0 {
		t.status = code
		if !t.discard {
			t.header = t.ResponseWriter.Header().Clone()
		}
	}
	if !t.discard {
		t.ResponseWriter.WriteHeader(code)
	}
}

func (t *teeWriter) Write(b []byte) (int, error) {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	t.body.Write(b)
	if t.discard {
		return len(b), nil
	}
	return t.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (t *teeWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// request starts a business handler behind the middleware: the request's
// operation and its server record, given the claim's token; a request the
// service does not know is answered 400, and ok is false.
func (s *service) request(w http.ResponseWriter, r *http.Request) (o *op, sr *serverRec, ok bool) {
	sr, _ = r.Context().Value(recKey{}).(*serverRec)
	o = s.op(r)
	if sr == nil || o == nil {
		http.Error(w, "unknown operation", http.StatusBadRequest)
		return nil, nil, false
	}
	sr.tok, _ = claimhttp.Token(r.Context())
	return o, sr, true
}

// recordClaimed adds to the history the durable claim a workflow handler
// runs under (it runs only under one).
func (s *service) recordClaimed(o *op, sr *serverRec) {
	epoch, fp, _ := o.get()
	s.e.rec.Add(history.Call{Key: o.key, Epoch: epoch, Client: 2000, Kind: history.Acquire, Token: sr.tok, Fingerprint: fp,
		Start: sr.start, End: s.e.rec.Now()})
}

// handle is the business handler behind the middleware.
func (s *service) handle(w http.ResponseWriter, r *http.Request) {
	e := s.e
	ctx := r.Context()
	o, sr, ok := s.request(w, r)
	if !ok {
		return
	}
	tok := sr.tok
	epoch, _, reject := o.get()
	if s.flow {
		s.recordClaimed(o, sr)
		dctx, cancel := context.WithTimeout(ctx, s.dTime)
		id, err := fault.CallDownstream(dctx, e.httpc, s.d.URL(), claimhttp.OperationID(ctx), tok)
		cancel()
		var de *fault.DownstreamError
		switch {
		case errors.As(err, &de) && de.Status == http.StatusServiceUnavailable:
			// The downstream refused before acting: nothing happened, and
			// only the handler can say so (the workflow rule).
			_ = claimhttp.ReleaseKey(ctx)
			answer(w, sr, http.StatusServiceUnavailable, []byte(`{"error":"downstream unavailable"}`))
		case errors.As(err, &de):
			answer(w, sr, http.StatusServiceUnavailable, []byte(`{"error":"downstream unavailable"}`))
		case err != nil:
			_ = claimhttp.MarkUncertain(ctx)
			answer(w, sr, http.StatusAccepted, []byte(`{"uncertain":true}`))
		default:
			answer(w, sr, http.StatusOK, flowBody(o.key, epoch, id))
		}
		return
	}
	tx, ok := claimhttp.Tx[pgxTx](ctx)
	if !ok {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	if reject {
		answer(w, sr, http.StatusPaymentRequired, doBody(o.key, epoch, tok, true))
		return
	}
	body := doBody(o.key, epoch, tok, false)
	if _, err := e.tables.InsertEffect(ctx, tx, e.name, history.Effect{Key: o.key, Epoch: epoch, Owner: tok.Owner,
		Generation: tok.Generation, Body: history.Hash(body), Via: "http"}); err != nil {
		answer(w, sr, http.StatusServiceUnavailable, []byte(`{"error":"database"}`))
		return
	}
	answer(w, sr, http.StatusCreated, body)
}

// httpAttempt is one request of client c through its retrying Transport.
func (s *service) attempt(ctx context.Context, w *workload, o *op, c int) bool {
	e := s.e
	s.logical.Add(1)
	epoch, fp, _ := o.get()
	key := strconv.Quote(o.scope.Key) // the draft's sf-string form: chaos keys are printable ASCII
	actx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	if s.requestCtx != nil {
		var cut context.CancelFunc
		actx, cut = s.requestCtx(actx, o, c)
		defer cut()
	}
	req, err := http.NewRequestWithContext(actx, http.MethodPost, s.url(), bytes.NewReader(fmt.Appendf(nil, `{"op":%q,"epoch":%d}`, o.key, epoch)))
	if err != nil {
		return false
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	call := history.Call{Key: o.key, Epoch: epoch, Client: c, Fingerprint: fp, Start: e.rec.Now()}
	resp, err := s.clients[c%len(s.clients)].Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	call.End = e.rec.Now()
	final := false
	switch {
	case err != nil:
		call.Kind, call.Note = history.NoEffect, err.Error()
		e.observe("http-error")
	case resp.StatusCode == http.StatusUnprocessableEntity:
		call.Kind, call.Note = history.Mismatch, "422"
		final = true
	case resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusPaymentRequired:
		call.Kind, call.Body, call.Status = history.Replay, history.Hash(body), resp.StatusCode
		final = true
		if resp.Header.Get(claimclient.HeaderReplayed) == "true" {
			e.observe("http-replayed")
		}
	default:
		call.Kind, call.Note = history.NoEffect, resp.Status
		e.observe(fmt.Sprintf("http-%d", resp.StatusCode))
	}
	e.rec.Add(call)
	return final
}

// httpWorkload runs every client through the service.
func (e *env) httpWorkload(ctx context.Context, flow bool, plan func(o *op, n int) (fault.Behavior, time.Duration)) (*workload, *service, error) {
	w, st, err := e.standardOn(ctx, storeOpts{}, e.userRedis, claimerOpts{})
	if err != nil {
		return nil, nil, err
	}
	// Duplicates wait for the first request instead of answering 409 at
	// once: the transport would wait out a Retry-After of at least 1s.
	server, err := e.claimer(claimerOpts{store: st, redis: e.redisUser("", nil), policy: claim.WithWait(2 * e.cfg.Lease)})
	if err != nil {
		return nil, nil, err
	}
	if flow {
		w.modeOf = flowAll
		if err := e.withDownstream(w, plan); err != nil {
			return nil, nil, err
		}
	} else {
		w.rejectRate = 0.1
	}
	s, err := e.newService(ctx, server, flow, w.downstream)
	if err != nil {
		return nil, nil, err
	}
	w.http = s
	return w, s, nil
}

func setupHTTPLostResponse(ctx context.Context, e *env) (*workload, error) {
	w, _, err := e.httpWorkload(ctx, false, nil)
	if err != nil {
		return nil, err
	}
	w.startOp = func(_ context.Context, o *op) { e.planned(o, "drop", 0.6, 0) }
	return w, nil
}

func setupHTTPIncident(ctx context.Context, e *env) (*workload, error) {
	w, s, err := e.httpWorkload(ctx, true, failuresFirst(nil))
	if err != nil {
		return nil, err
	}
	w.startOp = func(_ context.Context, o *op) { e.planFailures(o, 5) }
	w.after = func(context.Context, *env, []*op) error {
		e.faultN("downstream-503", int64(w.downstream.Stats().Failures))
		return nil
	}
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		err := e.runOps(ctx, w, ops)
		// The transports' retries stay within their shared budget: at
		// most Floor per window plus Ratio of the requests.
		windows := int64(time.Since(s.started)/(10*time.Second)) + 2
		retries := s.requests.Load() - s.logical.Load()
		bound := 10*windows + s.logical.Load()/10 + 1
		e.counter(e.obs, "http-requests").Add(s.requests.Load())
		e.counter(e.obs, "http-retries").Add(retries)
		if retries > bound {
			e.violation("retry-budget", "", "%d retries for %d requests, the budget allows %d", retries, s.logical.Load(), bound)
		}
		return err
	}
	return w, nil
}
