package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/examples/internal/demoauth"
	"github.com/oncekey/oncekey/examples/internal/web"
)

// maxOrderBody bounds the body of POST /orders.
const maxOrderBody = 16 << 10

// Problem types of the service's own errors (the middleware's are under
// https://oncekey.dev/problems/).
const (
	problemInvalidOrder = "https://oncekey.dev/examples/problems/invalid-order"
	problemUnauthorized = "https://oncekey.dev/examples/problems/unauthorized"
	problemNotFound     = "https://oncekey.dev/examples/problems/not-found"
	problemUnavailable  = "https://oncekey.dev/examples/problems/unavailable"
)

// lease is how long a claim holds a key before another request may take it
// over (the library's default is 30s). Short, because it also bounds how
// long a Redis hiccup can delay duplicates: when the Redis step after the
// commit fails, Redis keeps answering "in progress" until its copy of the
// lease expires, although the result is durable.
const lease = 5 * time.Second

// app is the service: its handler and the sweeper that must run beside it.
type app struct {
	handler http.Handler
	// sweep deletes finished records past their retention, every minute
	// until ctx is done (Claimer.RunSweeper). Nothing else deletes them:
	// without it the idempotency table only grows.
	sweep func(context.Context) error
}

// newService builds the service on b: its table, a Claimer on b's durable
// store with b's Redis in front, the routes and the sweeper. The durable
// store's transaction type decides the type parameter, hence the two
// branches.
func newService(ctx context.Context, b *backend.Backend, log *slog.Logger) (*app, error) {
	opts := append(b.ClaimOptions(), claim.WithLease(lease), claim.WithLogger(log))
	if b.Postgres != nil {
		orders, err := newPGOrders(ctx, b.Pool)
		if err != nil {
			return nil, err
		}
		c, err := claim.New[pgx.Tx](b.Postgres, opts...)
		if err != nil {
			return nil, err
		}
		return routes(c, orders, log)
	}
	orders, err := newSQLiteOrders(ctx, b.DB)
	if err != nil {
		return nil, err
	}
	c, err := claim.New[*sql.Tx](b.SQLite, opts...)
	if err != nil {
		return nil, err
	}
	return routes(c, orders, log)
}

// service holds the handlers.
type service[TTx any] struct {
	orders orderStore[TTx]
	log    *slog.Logger
}

// routes wires the handlers: demo authentication first (demoauth: do
// not copy it, put your own authentication there), then per route
// validation, then the idempotency middleware in transaction mode; and the
// Claimer's sweeper.
func routes[TTx any](c *claim.Claimer[TTx], orders orderStore[TTx], log *slog.Logger) (*app, error) {
	guard, err := claimhttp.Middleware(c, demoauth.Tenant,
		claimhttp.WithInTransaction(), // the handler's insert joins the claim's transaction
		claimhttp.WithLogger(log))
	if err != nil {
		return nil, err
	}
	s := &service[TTx]{orders: orders, log: log}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", validOrder(guard(http.HandlerFunc(s.create))))
	mux.HandleFunc("GET /orders/{id}", s.get)
	mux.HandleFunc("GET /orders", s.list)
	sweep := func(ctx context.Context) error { return c.RunSweeper(ctx, time.Minute) }
	return &app{handler: demoauth.Middleware(mux), sweep: sweep}, nil
}

// create inserts the order in the transaction that holds the claim. The
// middleware stores the 201 in the same transaction and replays it to
// every retry.
func (s *service[TTx]) create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	in := orderFrom(ctx)
	tenant, _ := demoauth.Tenant(r)
	tx, ok := claimhttp.Tx[TTx](ctx)
	if !ok { // a wiring mistake: the route is not guarded in transaction mode
		web.Problem(w, http.StatusInternalServerError, problemUnavailable, "Order not created", "")
		return
	}
	o := Order{ID: newID("ord_"), Item: in.Item, Quantity: in.Quantity}
	if err := s.orders.insert(ctx, tx, tenant, claimhttp.OperationID(ctx), o); err != nil {
		// A 5xx releases the key: the transaction rolls back with the
		// claim, nothing was ordered, and a retry runs again.
		s.log.Error("orders: insert failed", "op", claimhttp.OperationID(ctx), "err", err)
		web.Problem(w, http.StatusServiceUnavailable, problemUnavailable, "Order not created", "Nothing was ordered; retry with the same key.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+o.ID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(o)
}

func (s *service[TTx]) get(w http.ResponseWriter, r *http.Request) {
	tenant, err := demoauth.Tenant(r)
	if err != nil {
		web.Problem(w, http.StatusUnauthorized, problemUnauthorized, "Unauthorized", "Send Authorization: Bearer <tenant>.")
		return
	}
	o, err := s.orders.get(r.Context(), tenant, r.PathValue("id"))
	switch {
	case errors.Is(err, errNotFound):
		web.Problem(w, http.StatusNotFound, problemNotFound, "Order not found", "")
		return
	case err != nil:
		s.log.Error("orders: get failed", "err", err)
		web.Problem(w, http.StatusServiceUnavailable, problemUnavailable, "Service unavailable", "")
		return
	}
	web.JSON(w, http.StatusOK, o)
}

func (s *service[TTx]) list(w http.ResponseWriter, r *http.Request) {
	tenant, err := demoauth.Tenant(r)
	if err != nil {
		web.Problem(w, http.StatusUnauthorized, problemUnauthorized, "Unauthorized", "Send Authorization: Bearer <tenant>.")
		return
	}
	orders, err := s.orders.list(r.Context(), tenant)
	if err != nil {
		s.log.Error("orders: list failed", "err", err)
		web.Problem(w, http.StatusServiceUnavailable, problemUnavailable, "Service unavailable", "")
		return
	}
	web.JSON(w, http.StatusOK, struct {
		Orders []Order `json:"orders"`
	}{Orders: append([]Order{}, orders...)})
}

// orderRequest is the body of POST /orders.
type orderRequest struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

func (o orderRequest) validate() error {
	switch {
	case o.Item == "" || len(o.Item) > 100 || !utf8.ValidString(o.Item):
		return fmt.Errorf("%w: item must be 1 to 100 bytes of UTF-8", errInvalidOrder)
	case o.Quantity < 1 || o.Quantity > 1000:
		return fmt.Errorf("%w: quantity must be 1 to 1000", errInvalidOrder)
	}
	return nil
}

// validOrder rejects an invalid order before the idempotency middleware
// sees it, so that it reserves nothing: the client can fix the request and
// send it again with the same key. It puts the parsed order in the context
// (orderFrom) and the body back for the middleware's fingerprint.
var validOrder = web.ValidJSON(web.BodyCheck[orderRequest]{
	MaxBytes: maxOrderBody,
	Problem:  problemInvalidOrder,
	Title:    "Invalid order",
	Example:  `{"item":"book","quantity":1}`,
	Validate: orderRequest.validate,
})

func orderFrom(ctx context.Context) orderRequest { return web.Body[orderRequest](ctx) }

// newID returns prefix and 16 random hex digits.
func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
