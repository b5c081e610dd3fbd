package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/examples/internal/demokit"
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
	d := &demo{demokit.Demo[Payment]{Score: demokit.Score{Out: out}, Ctx: ctx, Base: base, Path: "/payments"}}
	raw, closeRaw := demokit.RawClient()
	defer closeRaw()
	var tag [2]byte
	_, _ = rand.Read(tag[:])
	tenant := "acme-" + hex.EncodeToString(tag[:]) // fresh each run
	fmt.Fprintln(out, "payments: paying as tenant", tenant)

	// 1. Concurrent duplicates: twenty clients send the same payment with
	// the same key at once. Each has its own retrying transport, which
	// waits out 409 in-progress answers.
	key1 := demokit.MustKey()
	pay := `{"amount":1299,"currency":"EUR"}`
	replies, conflicts := demokit.Duplicates(duplicates, func(pool http.RoundTripper) reply {
		tr, err := claimclient.NewTransport(pool, claimclient.WithMaxAttempts(10)) // each client its own
		if err != nil {
			return reply{Err: err}
		}
		return d.Post(&http.Client{Transport: tr, Timeout: 30 * time.Second}, tenant, key1, pay)
	})
	first := replies[0]
	created, executed := demokit.Tally(&d.Score, replies)
	asked := gw.requestsFor(first.Value.ChargeID)
	d.Expect(executed == 1, "%d requests executed, want exactly 1", executed)
	d.Expect(asked == 1, "the gateway was asked %d times to make charge %q, want 1", asked, first.Value.ChargeID)
	d.Say("1. %d concurrent POST /payments with one key: %d × 201, all for charge %s; %d executed, %d replayed (%d in-progress answers retried); the gateway was asked once",
		duplicates, created, first.Value.ChargeID, executed, created-executed, conflicts)

	// 2. The same key for another amount: rejected, nothing charged.
	r := d.Post(raw, tenant, key1, `{"amount":2599,"currency":"EUR"}`)
	d.Expect(r.Status == http.StatusUnprocessableEntity && r.Problem.Type == claimclient.ProblemKeyReused, "reused key: %s, want 422", r)
	d.Say("2. the same key for another amount: %s", r)

	// 3. The unknown outcome: the gateway charges, then times out. The
	// service cannot know whether it charged, so it marks the payment
	// uncertain (202) instead of guessing; the reconciler asks the
	// gateway, and a retry with the key then gets the real answer.
	key3 := demokit.MustKey()
	pay3 := `{"amount":4200,"currency":"EUR"}`
	gw.setMode(modeTimeoutAfterCharge)
	r = d.Post(raw, tenant, key3, pay3)
	gw.setMode(modeNormal)
	op := r.Problem.OperationID
	ch, posts, charged := gw.chargeFor(op)
	d.Expect(r.Status == http.StatusAccepted && r.Problem.Type == claimclient.ProblemUncertain && op != "", "gateway timeout: %s, want 202 %s", r, claimclient.ProblemUncertain)
	d.Expect(charged && posts == 1, "the gateway holds charged=%v after %d requests, want one charge", charged, posts)
	d.Say("3. the gateway made charge %s, then timed out: %s, Location %s", ch.ID, r, r.Location)
	start := time.Now()
	r = d.Post(raw, tenant, key3, pay3)
	d.Say("   retried at once with the same key: %s", r)
	retries := 1
	for r.Err == nil && r.Status == http.StatusAccepted && time.Since(start) < reconcileWait {
		time.Sleep(100 * time.Millisecond)
		r = d.Post(raw, tenant, key3, pay3)
		retries++
	}
	_, posts, _ = gw.chargeFor(op)
	d.Expect(r.Status == http.StatusCreated && r.Replayed && r.Value.ChargeID == ch.ID, "after reconciling: %s for charge %q, want a replayed 201 for %s", r, r.Value.ChargeID, ch.ID)
	d.Expect(posts == 1, "the gateway was asked %d times to charge the payment, want 1", posts)
	d.Say("   the reconciler asked the gateway; retry %d (after %v) got %s for charge %s; the gateway was asked to charge once",
		retries, time.Since(start).Round(10*time.Millisecond), r, r.Value.ChargeID)

	charges, requests := gw.totals()
	d.Expect(charges == 2 && requests == 2, "the gateway made %d charges from %d requests, want 2 and 2", charges, requests)
	d.Say("gateway: %d charges from %d charge requests, for the 2 payments", charges, requests)

	return d.Verdict(errDemo)
}

// demo sends the demo's requests and keeps the score.
type demo struct{ demokit.Demo[Payment] }

// reply is what came back from one request.
type reply = demokit.Reply[Payment]
