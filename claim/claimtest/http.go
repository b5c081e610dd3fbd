package claimtest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
)

// Request is the request [Env.CheckHTTP] sends in every window; the check
// adds the Idempotency-Key field, a fresh key per window.
type Request struct {
	// Method is the request's method, POST if empty. It must be one the
	// middleware guards (POST and PATCH unless claimhttp.WithMethods).
	Method string
	// Path is the request's path, "/" if empty. The handler is mounted on
	// an http.ServeMux at Method and Path, so the operation is named
	// "Method Path" as it would be on that route.
	Path string
	// Header holds fields sent with every request (Content-Type, say).
	Header http.Header
	// Body is the request's body.
	Body string
	// Other is the body of the mismatch window's second request: the same
	// key with another payload. Empty: the same body, with the query
	// parameter claimtest-other=1 added to the path (the query is part of
	// the fingerprint).
	Other string
}

// crashMark in a request's context makes the check's wrapper panic after
// the handler returned.
type crashMark struct{}

// injected is the value of the panic the checks inject.
type injected struct{ what string }

func (i injected) String() string { return "claimtest: injected " + i.what }

// CheckHTTP runs h behind claimhttp.Middleware on e's Claimer through
// every window that applies to its mode (workflow by default,
// [WithInTransaction] for transaction mode), and reports each window it
// failed on tb with Errorf (tb may be nil). effects returns how many times
// h's effect happened so far; each request must add one. h must be safe
// for concurrent use, as any handler is.
//
// The middleware names the tenant "claimtest" and the operation "Method
// Path". It returns nil when every window passed, an error matching
// [ErrNotIdempotent] otherwise, or one matching [ErrConfig].
func (e *Env) CheckHTTP(tb testing.TB, h http.Handler, req Request, effects func() int, opts ...Option) error {
	if tb != nil {
		tb.Helper()
	}
	cfg, err := checkConfig("CheckHTTP", opts, "handler", h == nil, effects)
	if err != nil {
		return configFailure(tb, err)
	}
	if req.Method == "" {
		req.Method = http.MethodPost
	}
	if req.Path == "" {
		req.Path = "/"
	}
	if !strings.HasPrefix(req.Path, "/") || strings.ContainsAny(req.Path, "?# {}") {
		return configFailure(tb, configErr("CheckHTTP: Path %q must be a plain path starting with /, without query or wildcards", req.Path))
	}
	c := &httpCheck{e: e, req: req, inTx: cfg.inTx, dups: cfg.duplicates}
	mwOpts := append([]claimhttp.Option{claimhttp.WithLogger(discard)}, cfg.mw...)
	if cfg.inTx {
		mwOpts = append(mwOpts, claimhttp.WithInTransaction())
	}
	mw, err := claimhttp.Middleware(e.Claimer, func(*http.Request) (string, error) { return tenant, nil }, mwOpts...)
	if err != nil {
		return configFailure(tb, fmt.Errorf("%w: CheckHTTP: %w", ErrConfig, err))
	}
	mux := http.NewServeMux()
	mux.Handle(req.Method+" "+req.Path, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.runs.Add(1)
		if _, ok := claimhttp.Tx[*sql.Tx](r.Context()); ok != c.inTx {
			c.wrongMode.Store(true)
		}
		h.ServeHTTP(w, r)
		if r.Context().Value(crashMark{}) != nil {
			panic(injected{"panic after the handler returned"})
		}
	})))
	c.mux = mux

	mode := "workflow mode"
	if cfg.inTx {
		mode = "transaction mode"
	}
	run, skipped := cfg.plan(cfg.inTx)
	logSkipped(tb, skipped, "in "+mode)
	accounts := runWindows(run, mode+", "+req.Method+" "+req.Path, &c.runs, effects, c.window)
	if c.wrongMode.Load() {
		what := "ran in transaction mode: pass claimtest.WithInTransaction, not claimhttp.WithInTransaction in WithMiddleware"
		if cfg.inTx {
			what = "ran outside a transaction"
		}
		return configFailure(tb, configErr("CheckHTTP: the handler %s", what))
	}
	if c.unguarded.Load() {
		for _, a := range accounts {
			if len(a.wrong) > 0 {
				a.note("some answers did not come from the middleware (no %s field): is %s a guarded method?", claimclient.HeaderRetention, req.Method)
			}
		}
	}
	return report(tb, accounts)
}

// tenant is the tenant of every request the checks send.
const tenant = "claimtest"

type httpCheck struct {
	e         *Env
	req       Request
	inTx      bool
	dups      int
	mux       *http.ServeMux
	runs      atomic.Int64
	wrongMode atomic.Bool
	unguarded atomic.Bool // an answer came without the middleware's retention field
}

// answer is what came back for one request.
type answer struct {
	status   int
	header   http.Header
	body     []byte
	panicked any // set when the request panicked
	tries    int // requests sent until this answer
}

func (a answer) problem() string {
	if a.panicked != nil {
		return ""
	}
	mt, _, _ := mime.ParseMediaType(a.header.Get("Content-Type"))
	if mt != "application/problem+json" {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Type
}

func (a answer) replayed() bool { return a.header.Get(claimclient.HeaderReplayed) == "true" }

// inProgress reports an answer to retry: the first request still runs, or
// its result is not recorded yet.
func (a answer) inProgress() bool { return a.problem() == claimclient.ProblemInProgress }

func (a answer) String() string {
	if a.panicked != nil {
		return fmt.Sprintf("panic: %v", a.panicked)
	}
	s := fmt.Sprintf("%d %s", a.status, shown(a.body))
	if a.replayed() {
		s += " (replayed)"
	}
	if a.tries > 1 {
		s += fmt.Sprintf(" after %d tries", a.tries)
	}
	return s
}

// same reports whether b is the answer a again: status and body.
func same(a, b answer) bool {
	return a.panicked == nil && b.panicked == nil && a.status == b.status && bytes.Equal(a.body, b.body)
}

// send sends one request with key; other sends the mismatch window's
// other payload, crash injects a panic after the handler.
func (c *httpCheck) send(key string, other, crash bool) (a answer) {
	path, body := c.req.Path, c.req.Body
	if other {
		if c.req.Other != "" {
			body = c.req.Other
		} else {
			path += "?claimtest-other=1"
		}
	}
	r := httptest.NewRequest(c.req.Method, path, strings.NewReader(body))
	for k, vs := range c.req.Header {
		r.Header[k] = append([]string(nil), vs...)
	}
	r.Header.Set("Idempotency-Key", key)
	if crash {
		r = r.WithContext(context.WithValue(r.Context(), crashMark{}, true))
	}
	w := httptest.NewRecorder()
	defer func() {
		if v := recover(); v != nil {
			a = answer{panicked: v, tries: 1}
		}
	}()
	c.mux.ServeHTTP(w, r)
	if w.Header().Get(claimclient.HeaderRetention) == "" {
		c.unguarded.Store(true)
	}
	return answer{status: w.Code, header: w.Header(), body: w.Body.Bytes(), tries: 1}
}

// final sends the request until it is not answered in progress, as a
// client retrying on 409 and 202 does (for at most finalWithin).
func (c *httpCheck) final(key string) answer {
	a, tries := untilFinal(func() answer { return c.send(key, false, false) })
	a.tries = tries
	return a
}

func (c *httpCheck) sent(a *account, what string) {
	a.send("%s %s %s%s", c.req.Method, c.req.Path, shown([]byte(c.req.Body)), what)
}

// once records sending the request (what follows it in the account),
// sends it once with a's key (crash as send takes it), and records the
// answer.
func (c *httpCheck) once(a *account, what string, crash bool) answer {
	c.sent(a, what)
	x := c.send(a.key, false, crash)
	a.got("%v", x)
	return x
}

// retry records sending the request (what follows it in the account),
// sends it with a's key until it is not answered in progress, and records
// the answer.
func (c *httpCheck) retry(a *account, what string) answer {
	c.sent(a, what)
	x := c.final(a.key)
	a.got("%v", x)
	return x
}

// window runs one window and records it in a.
func (c *httpCheck) window(a *account, effects func() int, before int) {
	switch a.window {
	case Concurrent:
		answers := atOnce(c.dups, func() answer { return c.final(a.key) })
		for range answers {
			c.sent(a, ", at once with the others, retried while in progress")
		}
		fresh := 0
		for i, x := range answers {
			a.got("%v", x)
			if x.inProgress() {
				a.fail("request #%d was still in progress after %v", i+1, finalWithin)
			}
			if x.panicked == nil && !x.replayed() {
				fresh++
			}
		}
		if differ := numbered(answers, func(x answer) bool { return !same(answers[0], x) }); differ != "" {
			a.fail("answers %s differ from answer #1", differ)
		}
		if fresh != 1 {
			a.note("%d answers were not replays", fresh)
		}
		a.effectsWant(effects()-before, 1)
	case DroppedResponse, RedisEmptied:
		c.sent(a, "")
		first := c.send(a.key, false, false)
		a.got("%v (dropped: the client never saw it)", first)
		what := ", same key (the retry)"
		if a.window == RedisEmptied {
			c.e.flushRedis()
			what = ", same key, after Redis was emptied"
		}
		retry := c.retry(a, what)
		switch {
		case first.panicked != nil || first.inProgress():
			a.fail("the first request did not finish")
		case !same(first, retry):
			a.fail("the retry did not get the first answer")
		case !retry.replayed():
			a.fail("the retry's answer is not a replay (no %s: true)", claimclient.HeaderReplayed)
		}
		a.effectsWant(effects()-before, 1)
	case Mismatch:
		first := c.once(a, "", false)
		if c.req.Other != "" {
			a.send("%s %s %s, same key, another payload", c.req.Method, c.req.Path, shown([]byte(c.req.Other)))
		} else {
			a.send("%s %s?claimtest-other=1 %s, same key, another payload", c.req.Method, c.req.Path, shown([]byte(c.req.Body)))
		}
		other := c.send(a.key, true, false)
		a.got("%v", other)
		if other.status != http.StatusUnprocessableEntity || other.problem() != claimclient.ProblemKeyReused {
			a.fail("the other payload was not refused with 422 %s", claimclient.ProblemKeyReused)
		}
		if first.panicked != nil || first.inProgress() {
			a.fail("the first request did not finish")
		}
		a.effectsWant(effects()-before, 1)
	case PanicAfterEffect:
		first := c.once(a, ", a panic injected after the handler returned", true)
		a.wantInjected(first.panicked, "the middleware")
		retry := c.retry(a, ", same key (the retry)")
		if retry.status != http.StatusAccepted || retry.problem() != claimclient.ProblemUncertain {
			a.fail("the retry was not answered 202 %s: the operation after a panic is uncertain and must not run again", claimclient.ProblemUncertain)
		}
		a.effectsWant(effects()-before, 1)
	case CrashBeforeCommit:
		first := c.once(a, ", a panic injected after the handler returned, inside the transaction", true)
		a.wantInjected(first.panicked, "the middleware")
		a.wantRolledBack(effects() - before)
		retry := c.retry(a, ", same key (the retry: nothing committed, so it runs)")
		again := c.retry(a, ", same key (the next retry)")
		switch {
		case retry.panicked != nil || retry.inProgress():
			a.fail("the retry did not finish")
		case retry.replayed():
			a.fail("the retry was a replay, but nothing had committed")
		case !same(retry, again) || !again.replayed():
			a.fail("the next retry did not replay the retry's answer")
		}
		a.effectsWant(effects()-before, 1)
	}
}
