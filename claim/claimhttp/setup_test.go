package claimhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/driver/wire"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/settletest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// principal is what a (fake) authentication middleware puts in the
// context: the tests authenticate with "Authorization: Bearer <tenant>".
type principalKey struct{}

func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			r = r.WithContext(context.WithValue(r.Context(), principalKey{}, t))
		}
		next.ServeHTTP(w, r)
	})
}

func tenantOf(r *http.Request) (string, error) {
	t, _ := r.Context().Value(principalKey{}).(string)
	if t == "" {
		return "", errors.New("unauthenticated")
	}
	return t, nil
}

// fixture is a service with POST /orders and POST /refunds guarded by the
// middleware, on a fresh schema, with or without Redis.
type fixture struct {
	t      testing.TB
	schema testenv.Schema
	store  storeapi.Store[pgx.Tx]
	c      *claim.Claimer[pgx.Tx]
	rdb    *redis.Client
	prefix string
	tx     bool
	h      http.Handler // authenticate(mux)

	runs     atomic.Int64                                   // handler runs
	onRun    atomic.Pointer[func(n int64, r *http.Request)] // called at the start of each run
	onEffect atomic.Pointer[func(r *http.Request)]          // called right after the order row was inserted
}

type config struct {
	redis   bool
	claim   []claim.Option
	tx      bool // claimhttp.WithInTransaction
	options []claimhttp.Option
	// wrap, when set, puts a wrapper (fault injection) around the store
	// the Claimer uses; the fixture keeps the real one for reads.
	wrap func(storeapi.Store[pgx.Tx]) storeapi.Store[pgx.Tx]
}

func setup(t testing.TB, cfg config) *fixture {
	t.Helper()
	s, st := settletest.Store(t, settletest.Orders)
	f := &fixture{t: t, schema: s, store: st, tx: cfg.tx}
	opts := cfg.claim
	if cfg.redis {
		f.rdb, f.prefix = testenv.Redis(t)
		opts = append([]claim.Option{claim.WithRedis(f.rdb, lua.Options{Prefix: f.prefix, Timeout: time.Second})}, opts...)
	}
	var cs durable.Store[pgx.Tx] = st
	if cfg.wrap != nil {
		cs = cfg.wrap(st)
	}
	var err error
	f.c, err = claim.New[pgx.Tx](cs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	guard, err := claimhttp.Middleware(f.c, tenantOf, withMode(cfg.tx, cfg.options...)...)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", guard(http.HandlerFunc(f.orders)))
	mux.Handle("/refunds", guard(http.HandlerFunc(f.orders))) // no method in the pattern
	mux.Handle("GET /orders", guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "listing")
	})))
	f.h = authenticate(mux)
	return f
}

// orderIn is the request body. Status and Size shape the response; the
// order row is inserted unless Status is 4xx.
type orderIn struct {
	Item      string `json:"item"`
	Status    int    `json:"status,omitempty"`
	Size      int    `json:"size,omitempty"`
	Uncertain bool   `json:"uncertain,omitempty"`
	Sniff     bool   `json:"sniff,omitempty"`
}

type orderOut struct {
	ID   int64  `json:"id"`
	Item string `json:"item"`
	Op   string `json:"op"`
	Pad  string `json:"pad,omitempty"`
}

func (f *fixture) orders(w http.ResponseWriter, r *http.Request) {
	n := f.runs.Add(1)
	if hook := f.onRun.Load(); hook != nil {
		(*hook)(n, r)
	}
	ctx := r.Context()
	var in orderIn
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	if in.Uncertain {
		if err := claimhttp.MarkUncertain(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		http.Error(w, "gateway timeout", http.StatusGatewayTimeout)
		return
	}
	if in.Status >= 400 && in.Status < 500 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(in.Status)
		fmt.Fprintf(w, `{"error":"declined","item":%q}`, in.Item)
		return
	}
	tenant, _ := tenantOf(r)
	op := claimhttp.OperationID(ctx)
	const q = `INSERT INTO orders (tenant, item, op) VALUES ($1, $2, $3) RETURNING id`
	var id int64
	var err error
	if tx, ok := claimhttp.Tx[pgx.Tx](ctx); ok {
		err = tx.QueryRow(ctx, q, tenant, in.Item, op).Scan(&id)
	} else if f.tx {
		err = errors.New("transaction mode without a transaction")
	} else {
		err = f.schema.Pool.QueryRow(ctx, q, tenant, in.Item, op).Scan(&id)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if hook := f.onEffect.Load(); hook != nil {
		(*hook)(r)
	}
	if in.Status >= 500 {
		http.Error(w, "failed after the insert", in.Status)
		return
	}
	body, _ := json.Marshal(orderOut{ID: id, Item: in.Item, Op: op, Pad: strings.Repeat("x", in.Size)})
	if !in.Sniff {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.Header().Set("Set-Cookie", "session=first-response-only")
	w.Header().Set("X-Trace", "not-stored")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

func (f *fixture) hook(fn func(n int64, r *http.Request)) { f.onRun.Store(&fn) }

func (f *fixture) afterEffect(fn func(r *http.Request)) { f.onEffect.Store(&fn) }

func (f *fixture) rows(tenant string) int {
	f.t.Helper()
	var n int
	if err := f.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE tenant = $1`, tenant).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// newRequest builds a request for the fixture. key "" sends no key; the key
// is sent in the draft's quoted form.
func newRequest(tenant, method, path, key, body string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		r.Header.Set("Authorization", "Bearer "+tenant)
	}
	if key != "" {
		q, err := wire.FormatKey(key)
		if err != nil {
			panic(err)
		}
		r.Header.Set("Idempotency-Key", q)
	}
	return r
}

func (f *fixture) serve(r *http.Request) *httptest.ResponseRecorder {
	f.t.Helper()
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func (f *fixture) post(tenant, key, body string) *httptest.ResponseRecorder {
	f.t.Helper()
	return f.serve(newRequest(tenant, http.MethodPost, "/orders", key, body))
}

// record reads the durable record of a scope on POST /orders.
func (f *fixture) record(tenant, key string) (durable.Record, error) {
	f.t.Helper()
	ref, err := f.store.Ref(durable.Scope{Tenant: tenant, Operation: "POST /orders", Key: key})
	if err != nil {
		f.t.Fatal(err)
	}
	return f.store.Get(context.Background(), ref)
}

// expireLease ends the lease of a record now, by the database's clock, and
// drops its Redis lease, as if its worker had paused past it.
func (f *fixture) expireLease(tenant, key string) {
	f.t.Helper()
	ref, err := f.store.Ref(durable.Scope{Tenant: tenant, Operation: "POST /orders", Key: key})
	if err != nil {
		f.t.Fatal(err)
	}
	tag, err := f.schema.Pool.Exec(context.Background(),
		`UPDATE idempotency_requests SET lease_expires_at = clock_timestamp() - interval '1 second'
		 WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3`, ref.Tenant, ref.Operation, ref.KeyHash[:])
	if err != nil || tag.RowsAffected() != 1 {
		f.t.Fatalf("expire lease: %v (%d rows)", err, tag.RowsAffected())
	}
	if f.rdb != nil {
		f.rdb.Del(context.Background(), fastpath.KeysFor(f.prefix, ref).Record)
	}
}

// problemContentType is the media type of the middleware's problems.
const problemContentType = "application/problem+json"

// problem is an RFC 9457 problem document as the middleware writes it.
type problem struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Status      int    `json:"status"`
	Detail      string `json:"detail,omitempty"`
	OperationID string `json:"operation_id,omitempty"`
}

func problemOf(t *testing.T, w *httptest.ResponseRecorder) problem {
	t.Helper()
	return decodeProblem(t, w.Header(), w.Body.Bytes())
}

func decodeProblem(t *testing.T, h http.Header, body []byte) problem {
	t.Helper()
	if ct := h.Get("Content-Type"); ct != problemContentType {
		t.Fatalf("Content-Type = %q, want %s; body %s", ct, problemContentType, body)
	}
	var p problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem body %s: %v", body, err)
	}
	return p
}

// wantProblem checks the status and type of a problem response, and that
// it does not echo the key.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, typ, key string) problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	p := problemOf(t, w)
	if p.Type != typ || p.Status != status || p.Title == "" {
		t.Fatalf("problem = %+v, want type %s status %d", p, typ, status)
	}
	if key != "" && strings.Contains(w.Body.String(), key) {
		t.Fatalf("problem body echoes the key: %s", w.Body)
	}
	return p
}

type httptestRecorder = httptest.ResponseRecorder

func httptestServe(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func decodeJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// redisOption is the claim option that puts the fixture's Redis in front.
func (f *fixture) redisOption() []claim.Option {
	return []claim.Option{claim.WithRedis(f.rdb, lua.Options{Prefix: f.prefix, Timeout: time.Second})}
}

// testenvPoolless returns a pool that is never used (New does not connect).
func testenvPoolless(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// withMode returns opts with claimhttp.WithInTransaction added when tx.
func withMode(tx bool, opts ...claimhttp.Option) []claimhttp.Option {
	if tx {
		return append([]claimhttp.Option{claimhttp.WithInTransaction()}, opts...)
	}
	return opts
}
