package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/examples/internal/demoauth"
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
		problem(w, http.StatusInternalServerError, problemUnavailable, "Order not created", "")
		return
	}
	o := Order{ID: newID("ord_"), Item: in.Item, Quantity: in.Quantity}
	if err := s.orders.insert(ctx, tx, tenant, claimhttp.OperationID(ctx), o); err != nil {
		// A 5xx releases the key: the transaction rolls back with the
		// claim, nothing was ordered, and a retry runs again.
		s.log.Error("orders: insert failed", "op", claimhttp.OperationID(ctx), "err", err)
		problem(w, http.StatusServiceUnavailable, problemUnavailable, "Order not created", "Nothing was ordered; retry with the same key.")
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
		problem(w, http.StatusUnauthorized, problemUnauthorized, "Unauthorized", "Send Authorization: Bearer <tenant>.")
		return
	}
	o, err := s.orders.get(r.Context(), tenant, r.PathValue("id"))
	switch {
	case errors.Is(err, errNotFound):
		problem(w, http.StatusNotFound, problemNotFound, "Order not found", "")
		return
	case err != nil:
		s.log.Error("orders: get failed", "err", err)
		problem(w, http.StatusServiceUnavailable, problemUnavailable, "Service unavailable", "")
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (s *service[TTx]) list(w http.ResponseWriter, r *http.Request) {
	tenant, err := demoauth.Tenant(r)
	if err != nil {
		problem(w, http.StatusUnauthorized, problemUnauthorized, "Unauthorized", "Send Authorization: Bearer <tenant>.")
		return
	}
	orders, err := s.orders.list(r.Context(), tenant)
	if err != nil {
		s.log.Error("orders: list failed", "err", err)
		problem(w, http.StatusServiceUnavailable, problemUnavailable, "Service unavailable", "")
		return
	}
	writeJSON(w, http.StatusOK, struct {
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

type orderKey struct{}

func orderFrom(ctx context.Context) orderRequest {
	o, _ := ctx.Value(orderKey{}).(orderRequest)
	return o
}

// validOrder rejects an invalid order before the idempotency middleware
// sees it, so that it reserves nothing: the client can fix the request and
// send it again with the same key. It puts the parsed order in the context
// and the body back for the middleware's fingerprint.
func validOrder(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			problem(w, http.StatusUnsupportedMediaType, problemInvalidOrder, "Invalid order", "Send Content-Type: application/json.")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxOrderBody))
		if err != nil {
			problem(w, http.StatusRequestEntityTooLarge, problemInvalidOrder, "Invalid order", "The body is too large.")
			return
		}
		var in orderRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil || dec.More() {
			problem(w, http.StatusBadRequest, problemInvalidOrder, "Invalid order", `Send one JSON object: {"item":"book","quantity":1}.`)
			return
		}
		if err := in.validate(); err != nil {
			problem(w, http.StatusBadRequest, problemInvalidOrder, "Invalid order", err.Error())
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), orderKey{}, in)))
	})
}

// newID returns prefix and 16 random hex digits.
func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// problemContentType is the media type of RFC 9457 problems.
const problemContentType = "application/problem+json"

// problemDoc is an RFC 9457 problem document, with the members the
// middleware's problems have (see the claimhttp package documentation).
type problemDoc struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Status      int    `json:"status"`
	Detail      string `json:"detail,omitempty"`
	OperationID string `json:"operation_id,omitempty"`
}

// problem writes an RFC 9457 problem, in the middleware's format.
func problem(w http.ResponseWriter, status int, typ, title, detail string) {
	w.Header().Set("Content-Type", problemContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problemDoc{Type: typ, Title: title, Status: status, Detail: detail})
}
