package claimtest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"sync/atomic"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/claim/claimtest"
	"github.com/oncekey/oncekey/durable"
)

// Check an order handler in transaction mode: its order row commits with
// the idempotency record, so it passes every window. The same handler
// sending a mail before it writes the order (outside the transaction)
// fails the crash before commit: the rollback takes the order back, not
// the mail, and the retry sends it again. In a test, pass t instead of nil
// and use claimtest.New(t): each failed window is reported with t.Errorf.
func Example() {
	env, err := claimtest.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer env.Close()
	if _, err := env.DB.Exec(`CREATE TABLE orders (op_id TEXT PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	orders := func() int {
		var n int
		if err := env.DB.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
			log.Fatal(err)
		}
		return n
	}
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Item string `json:"item"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		tx, _ := claimhttp.Tx[*sql.Tx](r.Context())
		id := claimhttp.OperationID(r.Context())
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO orders VALUES (?, ?)`, id, in.Item); err != nil {
			http.Error(w, "not stored", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"item":%q}`, id, in.Item)
	})
	req := claimtest.Request{
		Path:   "/orders",
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   `{"item":"book"}`,
	}

	err = env.CheckHTTP(nil, createOrder, req, orders, claimtest.WithInTransaction())
	fmt.Println("order in the transaction, failed windows:", claimtest.Failed(err))

	var mails atomic.Int64
	mailFirst := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mails.Add(1) // sendConfirmation(...): not rolled back
		createOrder(w, r)
	})
	sent := func() int { return int(mails.Load()) }
	err = env.CheckHTTP(nil, mailFirst, req, sent, claimtest.WithInTransaction())
	fmt.Println("mail outside it, failed windows:", claimtest.Failed(err))
	// Output:
	// order in the transaction, failed windows: []
	// mail outside it, failed windows: [crash-before-commit]
}

// Check a function for claim.Claimer.Do that writes its order in the
// transaction Do gives it.
func ExampleEnv_CheckDo() {
	env, err := claimtest.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer env.Close()
	if _, err := env.DB.Exec(`CREATE TABLE orders (op_id TEXT PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	orders := func() int {
		var n int
		if err := env.DB.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
			log.Fatal(err)
		}
		return n
	}
	placeOrder := func(ctx context.Context, tx *sql.Tx, op claim.Op) (durable.Result, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES (?, 'book')`, op.ID); err != nil {
			return durable.Result{}, err
		}
		return durable.Result{StatusCode: 201, Body: []byte(`{"order":"` + op.ID + `"}`)}, nil
	}
	err = env.CheckDo(nil, placeOrder, orders)
	fmt.Println("failed windows:", claimtest.Failed(err))
	// Output:
	// failed windows: []
}
