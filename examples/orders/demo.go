package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
)

// duplicates is how many concurrent requests the demo sends with one key.
const duplicates = 20

// runDemo fires the demo's requests at the service at base, prints what
// happened to out, and returns an error wrapping errDemo when an
// expectation failed.
func runDemo(ctx context.Context, base string, cut *cutter, out io.Writer) error {
	d := &demo{ctx: ctx, base: base, out: out}
	plain := &http.Transport{}
	defer plain.CloseIdleConnections()
	raw := &http.Client{Transport: plain, Timeout: 10 * time.Second} // sends what it is given, retries nothing

	// Fresh tenants each run, so that runs against a real database do not
	// add up.
	run := newID("")[:4]
	acme, globex := "acme-"+run, "globex-"+run
	book := `{"item":"book","quantity":1}`

	// 1. Concurrent duplicates: twenty clients send the same order with
	// the same key at once (a double-click, a retry storm). Each has its
	// own retrying transport, which waits out 409 in-progress answers.
	key1 := mustKey()
	pool := &http.Transport{MaxIdleConnsPerHost: duplicates}
	defer pool.CloseIdleConnections()
	counted := &conflictCounter{base: pool}
	replies := make([]reply, duplicates)
	var wg sync.WaitGroup
	for i := range duplicates {
		wg.Go(func() {
			tr, err := claimclient.NewTransport(counted, claimclient.WithMaxAttempts(10))
			if err != nil {
				replies[i].err = err
				return
			}
			replies[i] = d.post(&http.Client{Transport: tr, Timeout: 30 * time.Second}, acme, key1, book)
		})
	}
	wg.Wait()
	first := replies[0]
	executed, created := 0, 0
	for i, r := range replies {
		d.expect(r.err == nil && r.status == http.StatusCreated, "request %d: %s, want 201", i+1, r)
		d.expect(string(r.body) == string(first.body), "request %d got another body than request 1", i+1)
		if r.status == http.StatusCreated {
			created++
			if !r.replayed {
				executed++
			}
		}
	}
	d.expect(executed == 1, "%d requests executed, want exactly 1", executed)
	d.say("1. %d concurrent POST /orders with one key: %d × 201, all for order %s; %d executed, %d replayed (%d in-progress answers were retried by the client transport)",
		duplicates, created, first.order.ID, executed, created-executed, counted.conflicts.Load())

	// 2. The same key for another request: rejected, nothing reserved.
	r := d.post(raw, acme, key1, `{"item":"lamp","quantity":1}`)
	d.expect(r.status == http.StatusUnprocessableEntity && r.problem.Type == claimclient.ProblemKeyReused, "reused key: %s, want 422 %s", r, claimclient.ProblemKeyReused)
	d.say("2. the same key for another item: %s", r)

	// 3. No key where one is required.
	r = d.post(raw, acme, "", book)
	d.expect(r.status == http.StatusBadRequest && r.problem.Type == claimclient.ProblemKeyMissing, "no key: %s, want 400 %s", r, claimclient.ProblemKeyMissing)
	d.say("3. no key: %s", r)

	// 4. The lost response: the service commits, then the connection is
	// cut before the answer. The client transport retries with the same
	// key and gets the stored answer instead of a second order.
	key2 := mustKey()
	cut.arm(key2)
	fresh := &http.Transport{} // a new connection: net/http itself does not retry it
	defer fresh.CloseIdleConnections()
	tr, err := claimclient.NewTransport(fresh)
	if err != nil {
		return err
	}
	r = d.post(&http.Client{Transport: tr, Timeout: 30 * time.Second}, acme, key2, `{"item":"lamp","quantity":2}`)
	seen := cut.requests()
	d.expect(r.status == http.StatusCreated && r.replayed, "after the cut: %s, want a replayed 201", r)
	d.expect(seen == 2, "the service saw %d requests with the key, want 2 (the cut one and the retry)", seen)
	got := d.get(raw, acme, "/orders/"+r.order.ID)
	d.expect(got.status == http.StatusOK && got.order == r.order, "GET /orders/%s: %s, want the order", r.order.ID, got)
	d.say("4. the response was cut after the commit: the client transport retried with the same key and got %s for order %s (the service saw %d requests)",
		r, r.order.ID, seen)

	// 5. Another tenant with the first key: keys are per tenant.
	r = d.post(raw, globex, key1, book)
	d.expect(r.status == http.StatusCreated && !r.replayed && r.order.ID != first.order.ID, "other tenant: %s, want a new 201", r)
	d.say("5. tenant %s with the key of step 1: %s, its own order %s", globex, r, r.order.ID)

	nAcme, nGlobex := d.count(raw, acme), d.count(raw, globex)
	d.expect(nAcme == 2, "%s has %d orders, want 2", acme, nAcme)
	d.expect(nGlobex == 1, "%s has %d orders, want 1", globex, nGlobex)
	d.say("orders: %s has %d (step 1's %d requests made one, step 4 one), %s has %d", acme, nAcme, duplicates, globex, nGlobex)

	if d.fails > 0 {
		return fmt.Errorf("%w: %d", errDemo, d.fails)
	}
	d.say("demo: every expectation held")
	return nil
}

// demo sends requests and keeps the score.
type demo struct {
	ctx   context.Context
	base  string
	out   io.Writer
	mu    sync.Mutex
	fails int
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, format+"\n", args...)
}

func (d *demo) expect(ok bool, format string, args ...any) {
	if ok {
		return
	}
	d.mu.Lock()
	d.fails++
	d.mu.Unlock()
	fmt.Fprintf(d.out, "   FAILED: "+format+"\n", args...)
}

// reply is what came back from one request.
type reply struct {
	err      error
	status   int
	replayed bool
	body     []byte
	problem  problemDoc // set for problem+json answers
	order    Order      // set for order answers
}

// String reads like "201 (replayed)" or "422 Idempotency key reused".
func (r reply) String() string {
	switch {
	case r.err != nil:
		return "error: " + r.err.Error()
	case r.problem.Type != "":
		return fmt.Sprintf("%d %s", r.status, r.problem.Title)
	case r.replayed:
		return fmt.Sprintf("%d (%s: true)", r.status, claimclient.HeaderReplayed)
	}
	return fmt.Sprint(r.status)
}

// post sends POST /orders as tenant; key "" sends none.
func (d *demo) post(c *http.Client, tenant, key, body string) reply {
	req, err := http.NewRequestWithContext(d.ctx, http.MethodPost, d.base+"/orders", strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tenant)
	if key != "" {
		req.Header.Set("Idempotency-Key", strconv.Quote(key)) // the draft's sf-string form
	}
	return do(c, req)
}

func (d *demo) get(c *http.Client, tenant, path string) reply {
	req, err := http.NewRequestWithContext(d.ctx, http.MethodGet, d.base+path, nil)
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+tenant)
	return do(c, req)
}

// count returns how many orders tenant has, or -1.
func (d *demo) count(c *http.Client, tenant string) int {
	r := d.get(c, tenant, "/orders")
	var list struct {
		Orders []Order `json:"orders"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &list) != nil {
		d.expect(false, "GET /orders as %s: %s", tenant, r)
		return -1
	}
	return len(list.Orders)
}

func do(c *http.Client, req *http.Request) reply {
	resp, err := c.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	r := reply{err: err, status: resp.StatusCode, body: body, replayed: resp.Header.Get(claimclient.HeaderReplayed) == "true"}
	switch mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt {
	case problemContentType:
		_ = json.Unmarshal(body, &r.problem)
	case "application/json":
		_ = json.Unmarshal(body, &r.order)
	}
	return r
}

func mustKey() string {
	k, err := claimclient.NewKey()
	if err != nil {
		panic(err)
	}
	return k
}

// conflictCounter counts the 409 answers that pass through it.
type conflictCounter struct {
	base      http.RoundTripper
	conflicts atomic.Int64
}

func (c *conflictCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusConflict {
		c.conflicts.Add(1)
	}
	return resp, err
}

// cutter cuts, once, the response to a request carrying the armed key: it
// lets the service run and commit, then closes the connection instead of
// sending the answer. That is the lost-response window: the client cannot
// tell a failure from a success it never heard of.
type cutter struct {
	next http.Handler

	mu   sync.Mutex
	key  string // the armed key; "" when none
	cut  bool   // the armed key's response was cut
	seen int    // requests that carried the armed key
}

func (c *cutter) arm(key string) {
	c.mu.Lock()
	c.key, c.cut, c.seen = key, false, 0
	c.mu.Unlock()
}

func (c *cutter) requests() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen
}

func (c *cutter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if key, err := strconv.Unquote(r.Header.Get("Idempotency-Key")); err == nil { // the transport sends it quoted
		c.mu.Lock()
		if c.key != "" && key == c.key {
			c.seen++
			if !c.cut {
				c.cut = true
				w = &cutWriter{ResponseWriter: w}
			}
		}
		c.mu.Unlock()
	}
	c.next.ServeHTTP(w, r)
}

// cutWriter closes the connection when the response starts. The
// idempotency middleware starts a response only once its result is
// durable, so the cut always comes after the commit.
type cutWriter struct {
	http.ResponseWriter
	done bool
}

func (c *cutWriter) WriteHeader(int) { c.cutNow() }

func (c *cutWriter) Write([]byte) (int, error) {
	c.cutNow()
	return 0, http.ErrHijacked
}

func (c *cutWriter) cutNow() {
	if c.done {
		return
	}
	c.done = true
	if conn, _, err := http.NewResponseController(c.ResponseWriter).Hijack(); err == nil {
		_ = conn.Close()
	}
}
