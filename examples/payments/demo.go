package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

// reconcileWait bounds how long the demo polls for an uncertain payment
// to be resolved.
const reconcileWait = 10 * time.Second

// runDemo fires the demo's requests at the service at base, prints what
// happened to out, and returns an error wrapping errDemo when an
// expectation failed.
func runDemo(ctx context.Context, base string, gw *gateway, out io.Writer) error {
	d := &demo{ctx: ctx, base: base, out: out}
	plain := &http.Transport{}
	defer plain.CloseIdleConnections()
	raw := &http.Client{Transport: plain, Timeout: 10 * time.Second} // sends what it is given, retries nothing
	var tag [2]byte
	_, _ = rand.Read(tag[:])
	tenant := "acme-" + hex.EncodeToString(tag[:]) // fresh each run
	fmt.Fprintln(out, "payments: paying as tenant", tenant)

	// 1. Concurrent duplicates: twenty clients send the same payment with
	// the same key at once. Each has its own retrying transport, which
	// waits out 409 in-progress answers.
	key1 := mustKey()
	pay := `{"amount":1299,"currency":"EUR"}`
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
			replies[i] = d.post(&http.Client{Transport: tr, Timeout: 30 * time.Second}, tenant, key1, pay)
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
	asked := gw.requestsFor(first.payment.ChargeID)
	d.expect(executed == 1, "%d requests executed, want exactly 1", executed)
	d.expect(asked == 1, "the gateway was asked %d times to make charge %q, want 1", asked, first.payment.ChargeID)
	d.say("1. %d concurrent POST /payments with one key: %d × 201, all for charge %s; %d executed, %d replayed (%d in-progress answers retried); the gateway was asked once",
		duplicates, created, first.payment.ChargeID, executed, created-executed, counted.conflicts.Load())

	// 2. The same key for another amount: rejected, nothing charged.
	r := d.post(raw, tenant, key1, `{"amount":2599,"currency":"EUR"}`)
	d.expect(r.status == http.StatusUnprocessableEntity && r.problem.Type == claimclient.ProblemKeyReused, "reused key: %s, want 422", r)
	d.say("2. the same key for another amount: %s", r)

	// 3. The unknown outcome: the gateway charges, then times out. The
	// service cannot know whether it charged, so it marks the payment
	// uncertain (202) instead of guessing; the reconciler asks the
	// gateway, and a retry with the key then gets the real answer.
	key3 := mustKey()
	pay3 := `{"amount":4200,"currency":"EUR"}`
	gw.setMode(modeTimeoutAfterCharge)
	r = d.post(raw, tenant, key3, pay3)
	gw.setMode(modeNormal)
	op := r.problem.OperationID
	ch, posts, charged := gw.chargeFor(op)
	d.expect(r.status == http.StatusAccepted && r.problem.Type == claimclient.ProblemUncertain && op != "", "gateway timeout: %s, want 202 %s", r, claimclient.ProblemUncertain)
	d.expect(charged && posts == 1, "the gateway holds charged=%v after %d requests, want one charge", charged, posts)
	d.say("3. the gateway made charge %s, then timed out: %s, Location %s", ch.ID, r, r.location)
	start := time.Now()
	r = d.post(raw, tenant, key3, pay3)
	d.say("   retried at once with the same key: %s", r)
	retries := 1
	for r.err == nil && r.status == http.StatusAccepted && time.Since(start) < reconcileWait {
		time.Sleep(100 * time.Millisecond)
		r = d.post(raw, tenant, key3, pay3)
		retries++
	}
	_, posts, _ = gw.chargeFor(op)
	d.expect(r.status == http.StatusCreated && r.replayed && r.payment.ChargeID == ch.ID, "after reconciling: %s for charge %q, want a replayed 201 for %s", r, r.payment.ChargeID, ch.ID)
	d.expect(posts == 1, "the gateway was asked %d times to charge the payment, want 1", posts)
	d.say("   the reconciler asked the gateway; retry %d (after %v) got %s for charge %s; the gateway was asked to charge once",
		retries, time.Since(start).Round(10*time.Millisecond), r, r.payment.ChargeID)

	charges, requests := gw.totals()
	d.expect(charges == 2 && requests == 2, "the gateway made %d charges from %d requests, want 2 and 2", charges, requests)
	d.say("gateway: %d charges from %d charge requests, for the 2 payments", charges, requests)

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
	location string
	body     []byte
	problem  problemDoc // set for problem+json answers
	payment  Payment    // set for payment answers
}

// String reads like "201 (Idempotent-Replayed: true)" or "202 Outcome
// being reconciled".
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

// post sends POST /payments as tenant with key.
func (d *demo) post(c *http.Client, tenant, key, body string) reply {
	req, err := http.NewRequestWithContext(d.ctx, http.MethodPost, d.base+"/payments", strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tenant)
	req.Header.Set("Idempotency-Key", strconv.Quote(key)) // the draft's sf-string form
	resp, err := c.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r := reply{err: err, status: resp.StatusCode, body: b, location: resp.Header.Get("Location"),
		replayed: resp.Header.Get(claimclient.HeaderReplayed) == "true"}
	switch mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt {
	case problemContentType:
		_ = json.Unmarshal(b, &r.problem)
	case "application/json":
		_ = json.Unmarshal(b, &r.payment)
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
