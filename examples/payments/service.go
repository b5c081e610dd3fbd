package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/examples/internal/demoauth"
	"github.com/oncekey/oncekey/examples/internal/web"
)

// operation is the operation name of POST /payments: the middleware's
// default, the method and the route pattern.
const operation = "POST /payments"

// maxPaymentBody bounds the body of POST /payments.
const maxPaymentBody = 16 << 10

// Problem types of the service's own answers (the middleware's are under
// https://oncekey.dev/problems/).
const (
	problemInvalidPayment = "https://oncekey.dev/examples/problems/invalid-payment"
	problemNotCharged     = "https://oncekey.dev/examples/problems/not-charged"
	problemUnavailable    = "https://oncekey.dev/examples/problems/unavailable"
)

// Payment is the answer to POST /payments.
type Payment struct {
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"` // "succeeded" or "declined"
}

// resultFor is the stored answer for a known charge: 201 for a charge that
// succeeded (stored as completed), 402 for one the gateway declined
// (stored as failed). The handler and the reconciler both build the answer
// here, so that the replay of a reconciled payment is byte for byte what
// the first request would have received. Its headers and version are the
// representation claimhttp stores (status, stored headers, body).
func resultFor(ch Charge) (durable.State, durable.Result) {
	body, _ := json.Marshal(Payment{ChargeID: ch.ID, Amount: ch.Amount, Currency: ch.Currency, Status: ch.Status})
	body = append(body, '\n')
	state, status := durable.Completed, http.StatusCreated
	if ch.Status != "succeeded" {
		state, status = durable.Failed, http.StatusPaymentRequired
	}
	return state, durable.Result{
		StatusCode: status,
		Headers:    map[string][]string{"Content-Type": {"application/json"}},
		Body:       body,
		Version:    1,
	}
}

// notCharged is the stored answer for a payment the gateway has no charge
// for: final (424), so that no retry with the key charges later.
func notCharged() durable.Result {
	body, _ := json.Marshal(web.ProblemDoc{
		Type: problemNotCharged, Title: "Payment not made", Status: http.StatusFailedDependency,
		Detail: "The gateway did not answer and has no charge for this payment: nothing was charged. Send a new request with a new key to pay.",
	})
	return durable.Result{
		StatusCode: http.StatusFailedDependency,
		Headers:    map[string][]string{"Content-Type": {web.ProblemContentType}, "Cache-Control": {"no-store"}},
		Body:       append(body, '\n'),
		Version:    1,
	}
}

// app is the service and its reconciler. The Claimer's type parameter is
// hidden behind these functions.
type app struct {
	handler http.Handler
	// reconcileOnce runs one reconciliation pass.
	reconcileOnce func(context.Context) (claim.Report, error)
	// reconcile runs passes every interval until ctx is done.
	reconcile func(context.Context) error
	// sweep deletes finished records past their retention, every minute
	// until ctx is done (Claimer.RunSweeper). Nothing else deletes them:
	// without it the idempotency table only grows.
	sweep func(context.Context) error
}

// lease is how long a claim holds a key before another request may take it
// over (the library's default is 30s); the middleware renews it while the
// handler waits for the gateway. Short, because it also bounds how long a
// Redis hiccup can delay duplicates: when the Redis step after the
// completion fails, Redis keeps answering "in progress" until its copy of
// the lease expires, although the result is durable.
const lease = 5 * time.Second

// newService builds the service on b, calling the gateway through gw, with
// a reconciler that runs every interval and a sweeper. The durable store's transaction
// type decides the type parameter, hence the two branches; the service
// itself never touches a transaction (workflow mode).
func newService(b *backend.Backend, gw *gatewayClient, log *slog.Logger, interval time.Duration) (*app, error) {
	opts := append(b.ClaimOptions(), claim.WithLease(lease), claim.WithLogger(log))
	if b.Postgres != nil {
		c, err := claim.New[pgx.Tx](b.Postgres, opts...)
		if err != nil {
			return nil, err
		}
		return build(c, gw, log, interval)
	}
	c, err := claim.New[*sql.Tx](b.SQLite, opts...)
	if err != nil {
		return nil, err
	}
	return build(c, gw, log, interval)
}

func build[TTx any](c *claim.Claimer[TTx], gw *gatewayClient, log *slog.Logger, interval time.Duration) (*app, error) {
	s := &service{gateway: gw, log: log}
	// Workflow mode (no WithInTransaction): the claim commits on its own with
	// a lease the middleware keeps alive while the handler calls the
	// gateway, and the answer is stored fenced when the handler returns.
	guard, err := claimhttp.Middleware(c, demoauth.Tenant, claimhttp.WithLogger(log))
	if err != nil {
		return nil, err
	}
	// Records of other operations are not this resolver's to decide: kept
	// out of its passes, as they were. Answering Unresolved for them would
	// mark them uncertain.
	rec, err := claim.NewReconciler(c, s.resolve, claim.WithSkip(func(_ context.Context, r durable.Record) (bool, error) {
		return r.Ref.Operation != operation, nil
	}))
	if err != nil {
		return nil, err
	}
	// The Location of the 202 answers, /operations/op_...: the operation's
	// state (uncertain until the reconciler decided, then completed or
	// failed with the stored status), for the caller's own payments only.
	ops, err := claimhttp.Operations(c, demoauth.Tenant, claimhttp.WithLogger(log))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(operation, validPayment(guard(http.HandlerFunc(s.pay))))
	mux.Handle("GET /operations/", ops)
	reconcile := func(ctx context.Context) error { return rec.Run(ctx, interval) }
	sweep := func(ctx context.Context) error { return c.RunSweeper(ctx, time.Minute) }
	return &app{handler: demoauth.Middleware(mux), reconcileOnce: rec.RunOnce, reconcile: reconcile, sweep: sweep}, nil
}

// service holds the handler and the reconciler's resolve function.
type service struct {
	gateway *gatewayClient
	log     *slog.Logger
}

// pay charges through the gateway, passing the operation identity as the
// gateway's idempotency key: every retry and takeover of this payment
// sends the same key, so the gateway never charges it twice either.
func (s *service) pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context() // cancelled if the lease is lost
	in := paymentFrom(ctx)
	op := claimhttp.OperationID(ctx)
	ch, err := s.gateway.charge(ctx, op, in.Amount, in.Currency)
	switch {
	case errors.Is(err, errOutcomeUnknown):
		// The gateway may have charged. Neither guess nor answer a plain
		// 5xx (that would store a failure for a payment that may exist):
		// mark the operation uncertain. The middleware answers 202 to this request
		// and every retry until the reconciler has asked the gateway.
		s.log.Info("payments: gateway outcome unknown; marked uncertain", "op", op, "err", err)
		if err := claimhttp.MarkUncertain(ctx); err != nil {
			s.log.Error("payments: mark uncertain", "op", op, "err", err)
		}
		return
	case err != nil:
		// Certainly not charged: say so, and the middleware releases the key
		// (it never assumes that nothing happened); a retry runs again.
		if err := claimhttp.ReleaseKey(ctx); err != nil {
			s.log.Error("payments: release key", "op", op, "err", err)
		}
		web.Problem(w, http.StatusServiceUnavailable, problemUnavailable, "Payment not made", "The gateway charged nothing; retry with the same key.")
		return
	}
	_, res := resultFor(ch)
	writeResult(w, res) // 201 stored as completed, 402 as failed
}

// resolve is the reconciler's question to the gateway about a payment
// whose outcome is unknown (or whose worker vanished): the charge it made
// with the operation identity as its key, if any.
func (s *service) resolve(ctx context.Context, rec durable.Record) (claim.Resolution, error) {
	ch, found, err := s.gateway.lookup(ctx, rec.Ref.OperationID())
	if err != nil {
		return claim.Unresolved(), err // ask again on the next pass
	}
	if !found {
		// This gateway charges before it answers and never after the
		// caller gave up, so no charge now means none ever. With a real
		// gateway, first wait out the longest it may take to process a
		// request it received (return claim.Unresolved() until then).
		return claim.Resolved(durable.Failed, notCharged()), nil
	}
	return claim.Resolved(resultFor(ch)), nil
}

// paymentRequest is the body of POST /payments; amounts are in minor
// units (cents).
type paymentRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

func (p paymentRequest) validate() error {
	if p.Amount < 1 || p.Amount > 10_000_000 {
		return fmt.Errorf("%w: amount must be 1 to 10000000 (minor units)", errInvalidPayment)
	}
	if len(p.Currency) != 3 {
		return fmt.Errorf("%w: currency must be three capital letters", errInvalidPayment)
	}
	for _, c := range []byte(p.Currency) {
		if c < 'A' || c > 'Z' {
			return fmt.Errorf("%w: currency must be three capital letters", errInvalidPayment)
		}
	}
	return nil
}

// validPayment rejects an invalid payment before the idempotency
// middleware sees it, so that it reserves nothing; it puts the parsed
// payment in the context (paymentFrom) and the body back for the
// fingerprint.
var validPayment = web.ValidJSON(web.BodyCheck[paymentRequest]{
	MaxBytes: maxPaymentBody,
	Problem:  problemInvalidPayment,
	Title:    "Invalid payment",
	Example:  `{"amount":1299,"currency":"EUR"}`,
	Validate: paymentRequest.validate,
})

func paymentFrom(ctx context.Context) paymentRequest { return web.Body[paymentRequest](ctx) }

// writeResult writes a stored-representation result as a response.
func writeResult(w http.ResponseWriter, res durable.Result) {
	for k, v := range res.Headers {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(res.Body)
}
