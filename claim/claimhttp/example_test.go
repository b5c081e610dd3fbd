package claimhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// The middleware guards POST /orders: the handler inserts the order in the
// transaction that stores the record, so a retry replays the stored response
// instead of creating a second order. The example runs on PostgreSQL
// without Redis; add claim.WithRedis in production.
func ExampleMiddleware() {
	pool, _, _, cleanup := testenv.Example() // a fresh schema on the test server
	defer cleanup()
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	store, err := postgres.New(pool)
	if err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text)`); err != nil {
		panic(err)
	}

	claimer, err := claim.New[pgx.Tx](store)
	if err != nil {
		panic(err)
	}
	// The tenant comes from authentication; here a fixed one.
	tenant := func(r *http.Request) (string, error) { return "tenant-42", nil }
	guard, err := claimhttp.Middleware(claimer, tenant, claimhttp.WithInTransaction())
	if err != nil {
		panic(err)
	}
	createOrder := func(w http.ResponseWriter, r *http.Request) {
		tx, _ := claimhttp.Tx[pgx.Tx](r.Context())
		var in struct{ Item string }
		_ = json.NewDecoder(r.Body).Decode(&in)
		var id int64
		err := tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ($1) RETURNING id`, in.Item).Scan(&id)
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // released and rolled back
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"item":%q}`, id, in.Item)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", guard(http.HandlerFunc(createOrder)))

	send := func(body string) {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Header().Get("Idempotency-Retention"), strings.TrimSpace(w.Body.String()))
	}
	send(`{"item":"book"}`)
	send(`{ "item": "book" }`) // the same request, spelled differently: replayed
	send(`{"item":"lamp"}`)    // the same key for another request: 422

	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201  86400 {"id":1,"item":"book"}
	// 201 true 86400 {"id":1,"item":"book"}
	// 422  86400 {"type":"https://oncekey.dev/problems/key-reused","title":"Idempotency key reused","status":422,"detail":"This key was already used for a different request."}
	// orders: 1
}
