package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// This file is the fake payment gateway: an HTTP server of its own, with
// its own idempotency keys, standing in for a real one (Stripe, Adyen...).
// The service talks to it only over HTTP, through gatewayClient.

// gatewayMode is what the fake gateway does with a charge request.
type gatewayMode int32

const (
	// modeNormal charges and answers.
	modeNormal gatewayMode = iota
	// modeTimeoutAfterCharge charges, then never answers: the caller times
	// out without knowing that the charge went through.
	modeTimeoutAfterCharge
	// modeTimeoutBeforeCharge never answers and charges nothing.
	modeTimeoutBeforeCharge
)

// parseMode reads a -gateway-mode flag value.
func parseMode(s string) (gatewayMode, error) {
	switch s {
	case "normal":
		return modeNormal, nil
	case "timeout-after-charge":
		return modeTimeoutAfterCharge, nil
	case "timeout-before-charge":
		return modeTimeoutBeforeCharge, nil
	}
	return 0, fmt.Errorf("%w: gateway mode %q (want normal, timeout-after-charge or timeout-before-charge)", errUsage, s)
}

// declineAbove is the largest amount the fake gateway charges; above it,
// it declines.
const declineAbove = 100_000

// Charge is a charge as the gateway reports it.
type Charge struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"` // "succeeded" or "declined"
}

// chargeRequest is the body of POST /v1/charges.
type chargeRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// gateway is the fake payment gateway. Its idempotency keys work like a
// real gateway's: the same key and parameters return the same charge, the
// same key with other parameters is refused, and a charge is never made
// twice for one key.
type gateway struct {
	mode atomic.Int32 // a gatewayMode

	mu      sync.Mutex
	byKey   map[string]gatewayEntry
	charges int // charges made
	posts   int // charge requests received

	url  string
	srv  *http.Server
	done chan struct{}
}

type gatewayEntry struct {
	req    chargeRequest
	charge Charge
	posts  int // charge requests received with this key
}

// startGateway starts the fake gateway on a free loopback port.
func startGateway() (*gateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &gateway{byKey: map[string]gatewayEntry{}, url: "http://" + ln.Addr().String(), done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", g.create)
	mux.HandleFunc("GET /v1/charges", g.lookup)
	g.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(g.done)
		_ = g.srv.Serve(ln)
	}()
	return g, nil
}

// close stops the gateway, cutting the requests it holds unanswered.
func (g *gateway) close() {
	_ = g.srv.Close()
	<-g.done
}

func (g *gateway) setMode(m gatewayMode) { g.mode.Store(int32(m)) }

// chargeFor returns the charge made with key, and how many charge
// requests carried key.
func (g *gateway) chargeFor(key string) (Charge, int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.byKey[key]
	return e.charge, e.posts, ok && e.charge.ID != ""
}

// requestsFor returns how many charge requests carried the key of the
// charge with this id (0 when there is none).
func (g *gateway) requestsFor(chargeID string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range g.byKey {
		if e.charge.ID == chargeID && chargeID != "" {
			return e.posts
		}
	}
	return 0
}

// totals returns the charges made and the charge requests received.
func (g *gateway) totals() (charges, posts int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.charges, g.posts
}

func (g *gateway) create(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var in chargeRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || key == "" || in.Amount <= 0 || len(in.Currency) != 3 {
		http.Error(w, `{"error":"invalid_request"}`, http.StatusBadRequest)
		return
	}
	mode := gatewayMode(g.mode.Load())

	g.mu.Lock()
	g.posts++
	e, seen := g.byKey[key]
	e.posts++
	switch {
	case seen && e.req != in:
		g.byKey[key] = e
		g.mu.Unlock()
		http.Error(w, `{"error":"idempotency_key_reused"}`, http.StatusUnprocessableEntity)
		return
	case mode == modeTimeoutBeforeCharge && e.charge.ID == "":
		g.byKey[key] = e
		g.mu.Unlock()
		<-r.Context().Done() // hold the request until the caller gives up
		return
	case e.charge.ID == "": // a new charge
		g.charges++
		e.req = in
		e.charge = Charge{ID: fmt.Sprintf("ch_%04d", g.charges), Amount: in.Amount, Currency: in.Currency, Status: "succeeded"}
		if in.Amount > declineAbove {
			e.charge.Status = "declined"
		}
	}
	g.byKey[key] = e
	g.mu.Unlock()

	if mode == modeTimeoutAfterCharge {
		<-r.Context().Done() // charged; now hold the answer until the caller gives up
		return
	}
	status := http.StatusCreated
	if e.charge.Status == "declined" {
		status = http.StatusPaymentRequired
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e.charge)
}

// lookup answers GET /v1/charges?idempotency_key=...: the charge made with
// the key, or 404 when none was.
func (g *gateway) lookup(w http.ResponseWriter, r *http.Request) {
	ch, _, ok := g.chargeFor(r.URL.Query().Get("idempotency_key"))
	if !ok {
		http.Error(w, `{"error":"no_such_charge"}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ch)
}

// gatewayClient is the service's client of the gateway.
type gatewayClient struct {
	base string
	http *http.Client
}

func newGatewayClient(base string, timeout time.Duration) *gatewayClient {
	return &gatewayClient{base: base, http: &http.Client{Timeout: timeout}}
}

// charge asks the gateway to charge, with key as the gateway's idempotency
// key. It returns the charge (succeeded or declined), or:
//
//   - errOutcomeUnknown when the request may have reached the gateway but
//     no answer came back (a timeout, a connection lost): the gateway may
//     have charged;
//   - errNotCharged when the gateway certainly charged nothing: it could
//     not be reached at all, or it answered with an error.
func (c *gatewayClient) charge(ctx context.Context, key string, amount int64, currency string) (Charge, error) {
	body, _ := json.Marshal(chargeRequest{Amount: amount, Currency: currency})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return Charge{}, fmt.Errorf("%w: %w", errNotCharged, err) // never sent
		}
		return Charge{}, fmt.Errorf("%w: %w", errOutcomeUnknown, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusCreated, http.StatusPaymentRequired:
		var ch Charge
		if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
			// It answered, so it decided; we lost what. Ask it later.
			return Charge{}, fmt.Errorf("%w: reading the answer: %w", errOutcomeUnknown, err)
		}
		return ch, nil
	}
	return Charge{}, fmt.Errorf("%w: gateway answered %d", errNotCharged, resp.StatusCode)
}

// lookup asks the gateway for the charge made with key; found is false
// when it made none.
func (c *gatewayClient) lookup(ctx context.Context, key string) (ch Charge, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/charges?idempotency_key="+url.QueryEscape(key), nil)
	if err != nil {
		return Charge{}, false, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return Charge{}, false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		err := json.NewDecoder(resp.Body).Decode(&ch)
		return ch, err == nil, err
	case http.StatusNotFound:
		return Charge{}, false, nil
	}
	return Charge{}, false, fmt.Errorf("payments: gateway lookup answered %d", resp.StatusCode)
}
