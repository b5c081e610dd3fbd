package claimtest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/claim/claimtest"
	"github.com/oncekey/oncekey/durable"
)

// recorder is a testing.TB that records what the checks report, so a test
// can assert that a check failed without failing itself. What it does not
// override (TempDir, Cleanup, Logf) goes to the real test.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	fatals []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Error(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.fatals = append(r.fatals, fmt.Sprintf(format, args...))
	r.mu.Unlock()
	panic("recorder: Fatalf")
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errors)+len(r.fatals) > 0
}

func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(append([]string(nil), r.errors...), r.fatals...)
}

// rawKey matches a key the checks make: no account may hold one.
var rawKey = regexp.MustCompile(`claimtest-[A-Z2-7]{26}`)

// wantCaught asserts that a check reported exactly the windows want, on
// the recorder and in its error, with accounts that name no key.
func wantCaught(t *testing.T, rec *recorder, err error, want ...claimtest.Window) {
	t.Helper()
	if !errors.Is(err, claimtest.ErrNotIdempotent) {
		t.Fatalf("err = %v, want ErrNotIdempotent", err)
	}
	if got := claimtest.Failed(err); !slices.Equal(got, want) {
		t.Errorf("failed windows = %v, want %v\n%v", got, want, err)
	}
	msgs := rec.messages()
	if len(msgs) != len(want) || len(rec.fatals) != 0 {
		t.Fatalf("recorded %d Errorf and %d Fatalf, want %d Errorf:\n%s", len(rec.errors), len(rec.fatals), len(want), strings.Join(msgs, "\n"))
	}
	for i, m := range msgs {
		if !strings.Contains(m, "window "+string(want[i])+": not idempotent") || !strings.Contains(m, "effects:") {
			t.Errorf("report %d does not name its window and effects:\n%s", i, m)
		}
		if rawKey.MatchString(m) {
			t.Errorf("report %d holds a raw key:\n%s", i, m)
		}
	}
	t.Logf("the kit reported, as a user would see it:\n%s", strings.Join(msgs, "\n\n"))
}

// orders is a table of orders in env's database, and the number of its
// rows.
func orders(t *testing.T, env *claimtest.Env) func() int {
	t.Helper()
	if _, err := env.DB.Exec(`CREATE TABLE orders (op_id TEXT PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return func() int {
		var n int
		if err := env.DB.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
			t.Errorf("count orders: %v", err)
		}
		return n
	}
}

// mails counts the mails a negative control sends before its write in the
// transaction: an effect outside it.
type mails struct{ n atomic.Int64 }

func (m *mails) send()      { m.n.Add(1) }
func (m *mails) count() int { return int(m.n.Load()) }

// mailFirst returns an Env with the orders table, for a negative control
// that sends mails (m) before its order, and a recorder for its reports.
func mailFirst(t *testing.T) (*claimtest.Env, *mails, *recorder) {
	t.Helper()
	env := claimtest.New(t)
	orders(t, env)
	return env, &mails{}, &recorder{TB: t}
}

// createOrder is a correct transaction-mode handler: the order row is
// written in the transaction that stores the idempotency record. before,
// if set, runs first (a negative control's effect outside it).
func createOrder(before func()) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Item string `json:"item"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Item == "" {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		if before != nil {
			before()
		}
		tx, ok := claimhttp.Tx[*sql.Tx](r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		id := claimhttp.OperationID(r.Context())
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO orders VALUES (?, ?)`, id, in.Item); err != nil {
			http.Error(w, "not stored", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"order":%q,"item":%q}`, id, in.Item)
	})
}

// charge is a workflow-mode handler: its effect is a call to a payment
// gateway (counted by charges). after, if set, runs after the charge.
func charge(charges *atomic.Int64, after func(r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		if after != nil {
			after(r)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":%d,"op":%q}`, n, claimhttp.OperationID(r.Context()))
	})
}

var orderRequest = claimtest.Request{
	Path:   "/orders",
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   `{"item":"book"}`,
}

// placeOrder is a correct function for Do: its order row is written in
// the transaction. before, if set, runs first.
func placeOrder(before func()) claimtest.DoFunc {
	return func(ctx context.Context, tx *sql.Tx, op claim.Op) (durable.Result, error) {
		if before != nil {
			before()
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES (?, 'book')`, op.ID); err != nil {
			return durable.Result{}, err
		}
		return durable.Result{StatusCode: 201, Body: []byte(`{"order":"` + op.ID + `"}`), ResourceID: op.ID}, nil
	}
}

func TestCheckHTTP_CorrectHandlerPassesEveryWindow(t *testing.T) {
	t.Parallel()
	t.Run("transaction", func(t *testing.T) {
		t.Parallel()
		env := claimtest.New(t)
		if err := env.CheckHTTP(t, createOrder(nil), orderRequest, orders(t, env), claimtest.WithInTransaction()); err != nil {
			t.Logf("err: %v", err)
		}
	})
	t.Run("workflow", func(t *testing.T) {
		t.Parallel()
		env := claimtest.New(t)
		var charges atomic.Int64
		effects := func() int { return int(charges.Load()) }
		if err := env.CheckHTTP(t, charge(&charges, nil), orderRequest, effects); err != nil {
			t.Logf("err: %v", err)
		}
	})
}

func TestCheckDo_CorrectFunctionPassesEveryWindow(t *testing.T) {
	t.Parallel()
	env := claimtest.New(t)
	if err := env.CheckDo(t, placeOrder(nil), orders(t, env)); err != nil {
		t.Logf("err: %v", err)
	}
}

// Negative control: fn sends a mail (its effect, counted) before its
// write in the transaction. A crash before COMMIT rolls the write back,
// not the mail, and the retry sends it again: the kit must say so, in the
// crash-before-commit window only.
func TestCheckDo_EffectOutsideTheTransactionIsCaught(t *testing.T) {
	t.Parallel()
	env, m, rec := mailFirst(t)
	err := env.CheckDo(rec, placeOrder(m.send), m.count)
	wantCaught(t, rec, err, claimtest.CrashBeforeCommit)
	if m := rec.messages(); len(m) == 1 && !strings.Contains(m[0], "effects: 2 counted, 1 expected") {
		t.Errorf("report does not count two effects:\n%s", m[0])
	}
}

// Negative control, over HTTP in transaction mode: the same mistake.
func TestCheckHTTP_EffectOutsideTheTransactionIsCaught(t *testing.T) {
	t.Parallel()
	env, m, rec := mailFirst(t)
	err := env.CheckHTTP(rec, createOrder(m.send), orderRequest, m.count, claimtest.WithInTransaction())
	wantCaught(t, rec, err, claimtest.CrashBeforeCommit)
}

// Negative control, workflow mode: the handler tells the middleware that
// nothing happened (ReleaseKey) after it charged. Every retry then charges
// again, and the kit must catch it in every window that retries.
func TestCheckHTTP_ReleaseAfterTheEffectIsCaught(t *testing.T) {
	t.Parallel()
	env := claimtest.New(t)
	var charges atomic.Int64
	release := func(r *http.Request) {
		if err := claimhttp.ReleaseKey(r.Context()); err != nil {
			t.Errorf("ReleaseKey: %v", err)
		}
	}
	rec := &recorder{TB: t}
	err := env.CheckHTTP(rec, charge(&charges, release), orderRequest, func() int { return int(charges.Load()) })
	wantCaught(t, rec, err, claimtest.Concurrent, claimtest.DroppedResponse, claimtest.PanicAfterEffect,
		claimtest.Mismatch, claimtest.RedisEmptied)
}

// Negative control: the fingerprint leaves out the member that says what
// is ordered, so the same key with another item replays the first order
// instead of being refused. Only the mismatch window can see it.
func TestCheckHTTP_FingerprintBlindToThePayloadIsCaught(t *testing.T) {
	t.Parallel()
	env := claimtest.New(t)
	req := orderRequest
	req.Other = `{"item":"pen"}`
	rec := &recorder{TB: t}
	err := env.CheckHTTP(rec, createOrder(nil), req, orders(t, env), claimtest.WithInTransaction(),
		claimtest.WithMiddleware(claimhttp.WithCanon(canon.Options{Exclude: []string{"/item"}})))
	wantCaught(t, rec, err, claimtest.Mismatch)
}

// Negative control: a handler whose effect counts twice per run fails
// every window, with Do too.
func TestCheck_DoubleEffectIsCaughtEverywhere(t *testing.T) {
	t.Parallel()
	env := claimtest.New(t)
	var n atomic.Int64
	effects := func() int { return int(n.Load()) }
	rec := &recorder{TB: t}
	err := env.CheckDo(rec, func(context.Context, *sql.Tx, claim.Op) (durable.Result, error) {
		n.Add(2)
		return durable.Result{StatusCode: 200}, nil
	}, effects, claimtest.WithWindows(claimtest.Concurrent, claimtest.DroppedResponse, claimtest.Mismatch, claimtest.RedisEmptied))
	wantCaught(t, rec, err, claimtest.Concurrent, claimtest.DroppedResponse, claimtest.Mismatch, claimtest.RedisEmptied)
}

// WithWindows runs only the windows named, and skips, with a log line,
// one that does not apply to the mode.
func TestWithWindows_RunsOnlyThose(t *testing.T) {
	t.Parallel()
	env, m, rec := mailFirst(t)
	// The mistake of the negative control above is invisible to these.
	err := env.CheckDo(rec, placeOrder(m.send), m.count,
		claimtest.WithWindows(claimtest.Mismatch, claimtest.PanicAfterEffect), claimtest.WithDuplicates(3))
	if err != nil || rec.Failed() {
		t.Fatalf("err = %v, reports %q", err, rec.messages())
	}
}

func TestCheck_BadConfiguration(t *testing.T) {
	t.Parallel()
	env := claimtest.New(t)
	effects := func() int { return 0 }
	h := http.NotFoundHandler()
	for name, check := range map[string]func(testing.TB) error{
		"one duplicate": func(tb testing.TB) error {
			return env.CheckDo(tb, placeOrder(nil), effects, claimtest.WithDuplicates(1))
		},
		"unknown window": func(tb testing.TB) error {
			return env.CheckHTTP(tb, h, orderRequest, effects, claimtest.WithWindows("crash-after-commit"))
		},
		"nil option":  func(tb testing.TB) error { return env.CheckDo(tb, placeOrder(nil), effects, nil) },
		"nil handler": func(tb testing.TB) error { return env.CheckHTTP(tb, nil, orderRequest, effects) },
		"nil effects": func(tb testing.TB) error { return env.CheckDo(tb, placeOrder(nil), nil) },
		"path with a query": func(tb testing.TB) error {
			return env.CheckHTTP(tb, h, claimtest.Request{Path: "/orders?x=1"}, effects)
		},
		"bad middleware option": func(tb testing.TB) error {
			return env.CheckHTTP(tb, h, orderRequest, effects, claimtest.WithMiddleware(claimhttp.WithMaxStoredBody(-1)))
		},
		"transaction mode behind the kit's back": func(tb testing.TB) error {
			return env.CheckHTTP(tb, h, orderRequest, effects, claimtest.WithWindows(claimtest.Mismatch),
				claimtest.WithMiddleware(claimhttp.WithInTransaction()))
		},
	} {
		rec := &recorder{TB: t}
		err := check(rec)
		if !errors.Is(err, claimtest.ErrConfig) || errors.Is(err, claimtest.ErrNotIdempotent) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
		if len(rec.messages()) != 1 {
			t.Errorf("%s: reported %q, want one report", name, rec.messages())
		}
	}
}
