package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/examples/internal/demokit"
)

// duplicates is how many concurrent requests the demo sends with one key.
const duplicates = 20

// runDemo fires the demo's requests at the service at base, prints what
// happened to out, and returns an error wrapping errDemo when an
// expectation failed.
func runDemo(ctx context.Context, base string, cut *cutter, out io.Writer) error {
	d := &demo{demokit.Demo[Order]{Score: demokit.Score{Out: out}, Ctx: ctx, Base: base, Path: "/orders"}}
	raw, closeRaw := demokit.RawClient()
	defer closeRaw()

	// Fresh tenants each run, so that runs against a real database do not
	// add up.
	run := newID("")[:4]
	acme, globex := "acme-"+run, "globex-"+run
	book := `{"item":"book","quantity":1}`

	// 1. Concurrent duplicates: twenty clients send the same order with
	// the same key at once (a double-click, a retry storm). Each has its
	// own retrying transport, which waits out 409 in-progress answers.
	key1 := demokit.MustKey()
	replies, conflicts := demokit.Duplicates(duplicates, func(pool http.RoundTripper) reply {
		tr, err := claimclient.NewTransport(pool, claimclient.WithMaxAttempts(10)) // each client its own
		if err != nil {
			return reply{Err: err}
		}
		return d.Post(&http.Client{Transport: tr, Timeout: 30 * time.Second}, acme, key1, book)
	})
	first := replies[0]
	created, executed := demokit.Tally(&d.Score, replies)
	d.Expect(executed == 1, "%d requests executed, want exactly 1", executed)
	d.Say("1. %d concurrent POST /orders with one key: %d × 201, all for order %s; %d executed, %d replayed (%d in-progress answers were retried by the client transport)",
		duplicates, created, first.Value.ID, executed, created-executed, conflicts)

	// 2. The same key for another request: rejected, nothing reserved.
	r := d.Post(raw, acme, key1, `{"item":"lamp","quantity":1}`)
	d.Expect(r.Status == http.StatusUnprocessableEntity && r.Problem.Type == claimclient.ProblemKeyReused, "reused key: %s, want 422 %s", r, claimclient.ProblemKeyReused)
	d.Say("2. the same key for another item: %s", r)

	// 3. No key where one is required.
	r = d.Post(raw, acme, "", book)
	d.Expect(r.Status == http.StatusBadRequest && r.Problem.Type == claimclient.ProblemKeyMissing, "no key: %s, want 400 %s", r, claimclient.ProblemKeyMissing)
	d.Say("3. no key: %s", r)

	// 4. The lost response: the service commits, then the connection is
	// cut before the answer. The client transport retries with the same
	// key and gets the stored answer instead of a second order.
	key2 := demokit.MustKey()
	cut.arm(key2)
	fresh := &http.Transport{} // a new connection: net/http itself does not retry it
	defer fresh.CloseIdleConnections()
	tr, err := claimclient.NewTransport(fresh)
	if err != nil {
		return err
	}
	r = d.Post(&http.Client{Transport: tr, Timeout: 30 * time.Second}, acme, key2, `{"item":"lamp","quantity":2}`)
	seen := cut.requests()
	d.Expect(r.Status == http.StatusCreated && r.Replayed, "after the cut: %s, want a replayed 201", r)
	d.Expect(seen == 2, "the service saw %d requests with the key, want 2 (the cut one and the retry)", seen)
	got := d.Get(raw, acme, "/orders/"+r.Value.ID)
	d.Expect(got.Status == http.StatusOK && got.Value == r.Value, "GET /orders/%s: %s, want the order", r.Value.ID, got)
	d.Say("4. the response was cut after the commit: the client transport retried with the same key and got %s for order %s (the service saw %d requests)",
		r, r.Value.ID, seen)

	// 5. Another tenant with the first key: keys are per tenant.
	r = d.Post(raw, globex, key1, book)
	d.Expect(r.Status == http.StatusCreated && !r.Replayed && r.Value.ID != first.Value.ID, "other tenant: %s, want a new 201", r)
	d.Say("5. tenant %s with the key of step 1: %s, its own order %s", globex, r, r.Value.ID)

	nAcme, nGlobex := d.count(raw, acme), d.count(raw, globex)
	d.Expect(nAcme == 2, "%s has %d orders, want 2", acme, nAcme)
	d.Expect(nGlobex == 1, "%s has %d orders, want 1", globex, nGlobex)
	d.Say("orders: %s has %d (step 1's %d requests made one, step 4 one), %s has %d", acme, nAcme, duplicates, globex, nGlobex)

	return d.Verdict(errDemo)
}

// demo sends the demo's requests and keeps the score.
type demo struct{ demokit.Demo[Order] }

// reply is what came back from one request.
type reply = demokit.Reply[Order]

// count returns how many orders tenant has, or -1.
func (d *demo) count(c *http.Client, tenant string) int {
	r := d.Get(c, tenant, "/orders")
	var list struct {
		Orders []Order `json:"orders"`
	}
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &list) != nil {
		d.Expect(false, "GET /orders as %s: %s", tenant, r)
		return -1
	}
	return len(list.Orders)
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
