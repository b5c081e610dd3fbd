package claimhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
)

// modes are the two ways the middleware runs a handler.
var modes = []struct {
	name string
	tx   bool
}{{"InTransaction", true}, {"Workflow", false}}

func TestMiddleware_Protocol(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, withRedis := range []bool{true, false} {
			name := mode.name + map[bool]string{true: "/WithRedis", false: "/WithoutRedis"}[withRedis]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f := setup(t, config{redis: withRedis, tx: mode.tx})

				t.Run("SameKeyTwiceReplaysByteForByte", func(t *testing.T) {
					first := f.post("acme", "k-same", `{"item":"book"}`)
					if first.Code != http.StatusCreated {
						t.Fatalf("first = %d %s", first.Code, first.Body)
					}
					if first.Header().Get(claimclient.HeaderReplayed) != "" {
						t.Fatal("first response marked as replayed")
					}
					if first.Header().Get("Set-Cookie") == "" || first.Header().Get("X-Trace") == "" {
						t.Fatal("first response lost a header the handler set")
					}
					for range 2 {
						again := f.post("acme", "k-same", `{ "item" : "book" }`) // same intent, other spelling
						if again.Code != first.Code || again.Body.String() != first.Body.String() {
							t.Fatalf("replay = %d %q, want %d %q", again.Code, again.Body, first.Code, first.Body)
						}
						if again.Header().Get(claimclient.HeaderReplayed) != "true" {
							t.Fatalf("replay lacks %s: true", claimclient.HeaderReplayed)
						}
						for _, h := range []string{"Content-Type", "Location"} {
							if again.Header().Get(h) != first.Header().Get(h) {
								t.Fatalf("replayed %s = %q, want %q", h, again.Header().Get(h), first.Header().Get(h))
							}
						}
						if again.Header().Get("Set-Cookie") != "" || again.Header().Get("X-Trace") != "" {
							t.Fatal("replay carries a header outside the stored allowlist")
						}
					}
					if n := f.rows("acme"); n != 1 {
						t.Fatalf("orders = %d, want 1", n)
					}
				})

				t.Run("KeyReusedWithAnotherBodyIs422", func(t *testing.T) {
					if w := f.post("acme", "k-reuse", `{"item":"book"}`); w.Code != http.StatusCreated {
						t.Fatalf("first = %d", w.Code)
					}
					before := f.runs.Load()
					w := f.post("acme", "k-reuse", `{"item":"lamp"}`)
					wantProblem(t, w, http.StatusUnprocessableEntity, claimclient.ProblemKeyReused, "k-reuse")
					if f.runs.Load() != before {
						t.Fatal("handler ran for a reused key")
					}
				})

				t.Run("TwoTenantsOneKeyAreTwoOperations", func(t *testing.T) {
					a := f.post("tenant-a", "k-shared", `{"item":"book"}`)
					b := f.post("tenant-b", "k-shared", `{"item":"book"}`)
					if a.Code != http.StatusCreated || b.Code != http.StatusCreated || b.Header().Get(claimclient.HeaderReplayed) != "" {
						t.Fatalf("a = %d, b = %d %q", a.Code, b.Code, b.Header().Get(claimclient.HeaderReplayed))
					}
					if a.Body.String() == b.Body.String() {
						t.Fatal("two tenants got the same order")
					}
					if f.rows("tenant-a") != 1 || f.rows("tenant-b") != 1 {
						t.Fatalf("rows a=%d b=%d, want 1 each", f.rows("tenant-a"), f.rows("tenant-b"))
					}
				})

				t.Run("SameKeyOnTwoRoutesNeverCollides", func(t *testing.T) {
					a := f.post("routes", "k-route", `{"item":"book"}`)
					b := f.serve(newRequest("routes", http.MethodPost, "/refunds", "k-route", `{"item":"book"}`))
					if a.Code != http.StatusCreated || b.Code != http.StatusCreated || b.Header().Get(claimclient.HeaderReplayed) != "" {
						t.Fatalf("orders = %d, refunds = %d", a.Code, b.Code)
					}
				})

				t.Run("HandlerPanic", func(t *testing.T) {
					// Transaction mode: the rollback removes the claim, the
					// key is free. Workflow mode: the handler may have acted
					// before it panicked, so the record is marked uncertain,
					// never released, and nothing runs again.
					f.hook(func(n int64, r *http.Request) {
						if r.Header.Get("X-Panic") != "" {
							panic("handler exploded")
						}
					})
					defer f.onRun.Store(nil)
					r := newRequest("acme", http.MethodPost, "/orders", "k-panic", `{"item":"book"}`)
					r.Header.Set("X-Panic", "1")
					func() {
						defer func() {
							if v := recover(); v != "handler exploded" {
								t.Fatalf("recovered %v, want the handler's panic", v)
							}
						}()
						f.serve(r)
						t.Fatal("the panic did not propagate")
					}()
					rec, err := f.record("acme", "k-panic")
					if mode.tx {
						if !errors.Is(err, durable.ErrNotFound) {
							t.Fatalf("record after panic = %+v, %v; want none (rolled back)", rec, err)
						}
						// The key is free: even another payload runs now.
						if w := f.post("acme", "k-panic", `{"item":"other"}`); w.Code != http.StatusCreated {
							t.Fatalf("after panic = %d %s", w.Code, w.Body)
						}
						return
					}
					if err != nil || rec.State != durable.Uncertain {
						t.Fatalf("record after panic = %+v, %v; want uncertain", rec, err)
					}
					runs := f.runs.Load()
					w := f.post("acme", "k-panic", `{"item":"book"}`)
					wantProblem(t, w, http.StatusAccepted, claimclient.ProblemUncertain, "k-panic")
					if f.runs.Load() != runs {
						t.Fatal("the handler ran again after a panic")
					}
				})

				t.Run("ServerError", func(t *testing.T) {
					// Transaction mode: a 5xx rolls back and releases, so the
					// retry runs again. Workflow mode: the insert committed on
					// its own before the 5xx, so the answer is stored (failed)
					// and replayed; nothing runs twice.
					before := f.rows("s5xx")
					w := f.post("s5xx", "k-5xx", `{"item":"book","status":503}`)
					if w.Code != http.StatusServiceUnavailable || w.Header().Get("Content-Type") == problemContentType {
						t.Fatalf("5xx = %d %s", w.Code, w.Body)
					}
					rec, err := f.record("s5xx", "k-5xx")
					switch {
					case mode.tx && !errors.Is(err, durable.ErrNotFound):
						t.Fatalf("record after 5xx = %+v, %v; want none (rolled back)", rec, err)
					case !mode.tx && (err != nil || rec.State != durable.Failed):
						t.Fatalf("record after 5xx = %+v, %v; want failed", rec, err)
					}
					want := before + 1 // workflow mode: the insert committed on its own
					if mode.tx {
						want = before // rolled back with the claim
					}
					if n := f.rows("s5xx"); n != want {
						t.Fatalf("rows = %d, want %d", n, want)
					}
					runs := f.runs.Load()
					again := f.post("s5xx", "k-5xx", `{"item":"book","status":503}`)
					replayed := again.Header().Get(claimclient.HeaderReplayed) == "true"
					if mode.tx == replayed || (f.runs.Load() == runs) != replayed {
						t.Fatalf("retry after 5xx: replayed %v, ran %v", replayed, f.runs.Load() != runs)
					}
					if !mode.tx && (again.Code != w.Code || again.Body.String() != w.Body.String() || f.rows("s5xx") != want) {
						t.Fatalf("workflow 5xx replay = %d %s", again.Code, again.Body)
					}
				})

				t.Run("ReleaseKeyFreesTheKey", func(t *testing.T) {
					// The application's explicit word that nothing happened
					// is the one way a workflow key is released after start.
					f.hook(func(n int64, r *http.Request) {
						if r.Header.Get("X-Release") != "" {
							if err := claimhttp.ReleaseKey(r.Context()); err != nil {
								panic(err)
							}
						}
					})
					defer f.onRun.Store(nil)
					r := newRequest("rel", http.MethodPost, "/orders", "k-rel", `{"item":"book","status":429}`)
					r.Header.Set("X-Release", "1")
					if w := f.serve(r); w.Code != http.StatusTooManyRequests {
						t.Fatalf("released = %d %s", w.Code, w.Body)
					}
					rec, err := f.record("rel", "k-rel")
					if !errors.Is(err, durable.ErrNotFound) && (err != nil || !rec.Released) {
						t.Fatalf("record = %+v, %v; want released or absent", rec, err)
					}
					runs := f.runs.Load()
					if w := f.post("rel", "k-rel", `{"item":"other"}`); w.Code != http.StatusCreated || f.runs.Load() != runs+1 {
						t.Fatalf("after ReleaseKey = %d %s", w.Code, w.Body)
					}
				})

				t.Run("BusinessRejectionIsStoredAndReplayed", func(t *testing.T) {
					first := f.post("s4xx", "k-402", `{"item":"book","status":402}`)
					if first.Code != http.StatusPaymentRequired {
						t.Fatalf("first = %d", first.Code)
					}
					rec, err := f.record("s4xx", "k-402")
					if err != nil || rec.State != durable.Failed {
						t.Fatalf("record = %v, %v; want failed", rec.State, err)
					}
					runs := f.runs.Load()
					again := f.post("s4xx", "k-402", `{"item":"book","status":402}`)
					if again.Code != http.StatusPaymentRequired || again.Body.String() != first.Body.String() || again.Header().Get(claimclient.HeaderReplayed) != "true" {
						t.Fatalf("replay = %d %s", again.Code, again.Body)
					}
					if f.runs.Load() != runs {
						t.Fatal("handler ran again for a stored rejection")
					}
				})

				t.Run("ConflictStatus", func(t *testing.T) {
					// Released (rolled back) in transaction mode; stored as
					// failed in workflow mode, where the handler may have
					// acted before it answered 409.
					f.post("s409", "k-409", `{"item":"book","status":409}`)
					rec, err := f.record("s409", "k-409")
					switch {
					case mode.tx && !errors.Is(err, durable.ErrNotFound):
						t.Fatalf("record after 409 = %+v, %v; want none", rec, err)
					case !mode.tx && (err != nil || rec.State != durable.Failed):
						t.Fatalf("record after 409 = %+v, %v; want failed", rec, err)
					}
					runs := f.runs.Load()
					f.post("s409", "k-409", `{"item":"book","status":409}`)
					if ran := f.runs.Load() != runs; ran != mode.tx {
						t.Fatalf("retry of a 409 ran = %v", ran)
					}
				})

				t.Run("SniffedContentTypeIsStored", func(t *testing.T) {
					first := f.post("sniff", "k-sniff", `{"item":"book","sniff":true}`)
					again := f.post("sniff", "k-sniff", `{"item":"book","sniff":true}`)
					ct := first.Header().Get("Content-Type")
					if ct == "" || again.Header().Get("Content-Type") != ct {
						t.Fatalf("Content-Type first %q, replay %q", ct, again.Header().Get("Content-Type"))
					}
				})
			})
		}
	}
}

func TestMiddleware_RejectsBeforeClaiming(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true, tx: true, options: []claimhttp.Option{claimhttp.WithCanon(canon.Options{MaxBody: 64})}})

	notClaimed := func(t *testing.T, tenant, key string) {
		t.Helper()
		if _, err := f.record(tenant, key); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("a record exists: %v", err)
		}
		if f.runs.Load() != 0 {
			t.Fatalf("handler ran %d times", f.runs.Load())
		}
	}

	t.Run("MissingKeyIs400", func(t *testing.T) {
		w := f.post("acme", "", `{"item":"book"}`)
		wantProblem(t, w, http.StatusBadRequest, claimclient.ProblemKeyMissing, "")
		if w.Header().Get(claimclient.HeaderRetention) != "86400" {
			t.Fatalf("retention header = %q", w.Header().Get(claimclient.HeaderRetention))
		}
		if f.runs.Load() != 0 {
			t.Fatal("handler ran")
		}
	})

	t.Run("BadKeyFormsAre400", func(t *testing.T) {
		forms := map[string][]string{
			"TwoLines":      {`"k-a"`, `"k-a"`},
			"Unterminated":  {`"k-unterminated`},
			"BadEscape":     {`"k\-bad"`},
			"Empty":         {`""`},
			"TooLong":       {`"` + strings.Repeat("k", 256) + `"`},
			"NotASCII":      {"\"k-caf\xc3\xa9\""},
			"List":          {`"k-1", "k-2"`},
			"Parameterized": {`"k-p";x=1`},
			"BareWithSpace": {`k with space`},
		}
		for name, lines := range forms {
			t.Run(name, func(t *testing.T) {
				r := newRequest("acme", http.MethodPost, "/orders", "", `{"item":"book"}`)
				for _, l := range lines {
					r.Header.Add("Idempotency-Key", l)
				}
				wantProblem(t, f.serve(r), http.StatusBadRequest, claimclient.ProblemKeyInvalid, strings.Trim(lines[0], `"`))
				if f.runs.Load() != 0 {
					t.Fatal("handler ran")
				}
			})
		}
	})

	t.Run("BareKeyIsAccepted", func(t *testing.T) {
		r := newRequest("bare", http.MethodPost, "/orders", "", `{"item":"book"}`)
		r.Header.Set("Idempotency-Key", "k-bare")
		quoted := f.post("bare", "k-bare", `{"item":"book"}`) // the same key, quoted
		first := f.serve(r)
		if quoted.Code != http.StatusCreated || first.Header().Get(claimclient.HeaderReplayed) != "true" {
			t.Fatalf("quoted %d, bare %d replayed=%q: the two forms name different keys", quoted.Code, first.Code, first.Header().Get(claimclient.HeaderReplayed))
		}
		f.runs.Store(0)
	})

	t.Run("BodyOverTheLimitIs413", func(t *testing.T) {
		big := `{"item":"` + strings.Repeat("b", 100) + `"}`
		wantProblem(t, f.post("acme", "k-big", big), http.StatusRequestEntityTooLarge, claimclient.ProblemBodyTooLarge, "k-big")
		notClaimed(t, "acme", "k-big")
	})

	t.Run("InvalidBodyIs400", func(t *testing.T) {
		for i, body := range []string{`{"item":`, `{"item":"a","item":"b"}`, `{"n":9007199254740993}`} {
			key := fmt.Sprintf("k-invalid-%d", i)
			wantProblem(t, f.post("acme", key, body), http.StatusBadRequest, claimclient.ProblemBodyInvalid, key)
			notClaimed(t, "acme", key)
		}
	})

	t.Run("NoTenantIs401", func(t *testing.T) {
		wantProblem(t, f.post("", "k-anon", `{"item":"book"}`), http.StatusUnauthorized, claimclient.ProblemUnidentified, "k-anon")
		if f.runs.Load() != 0 {
			t.Fatal("handler ran")
		}
	})

	t.Run("UnguardedMethodPassesThrough", func(t *testing.T) {
		w := f.serve(newRequest("acme", http.MethodGet, "/orders", "", ""))
		if w.Code != http.StatusOK || w.Body.String() != "listing" || w.Header().Get(claimclient.HeaderRetention) != "" {
			t.Fatalf("GET = %d %q retention=%q", w.Code, w.Body, w.Header().Get(claimclient.HeaderRetention))
		}
	})
}

func TestMiddleware_OptionalKey(t *testing.T) {
	t.Parallel()
	f := setup(t, config{tx: true, options: []claimhttp.Option{
		claimhttp.WithOptional(func(r *http.Request) bool { return r.URL.Query().Has("optional") }),
	}})
	r := newRequest("acme", http.MethodPost, "/orders?optional", "", `{"item":"book"}`)
	w := f.serve(r)
	if w.Code != http.StatusInternalServerError { // the handler runs unguarded: no transaction
		t.Fatalf("optional without key = %d %s", w.Code, w.Body)
	}
	if w.Header().Get(claimclient.HeaderRetention) != "" {
		t.Fatal("unguarded request advertises retention")
	}
	wantProblem(t, f.post("acme", "", `{"item":"book"}`), http.StatusBadRequest, claimclient.ProblemKeyMissing, "")
	// With a key the route is guarded as usual.
	r = newRequest("acme", http.MethodPost, "/orders?optional", "k-opt", `{"item":"book"}`)
	if w := f.serve(r); w.Code != http.StatusCreated {
		t.Fatalf("optional with key = %d", w.Code)
	}
}

func TestMiddleware_RetentionHeader(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true,
		claim: []claim.Option{claim.WithOperationRetention("POST /refunds", 2*time.Hour)},
		tx:    true})
	for _, tc := range []struct {
		path, want string
	}{{"/orders", "86400"}, {"/refunds", "7200"}} {
		first := f.serve(newRequest("acme", http.MethodPost, tc.path, "k-ret", `{"item":"book"}`))
		replay := f.serve(newRequest("acme", http.MethodPost, tc.path, "k-ret", `{"item":"book"}`))
		reused := f.serve(newRequest("acme", http.MethodPost, tc.path, "k-ret", `{"item":"other"}`))
		if first.Code != http.StatusCreated || replay.Header().Get(claimclient.HeaderReplayed) != "true" || reused.Code != http.StatusUnprocessableEntity {
			t.Fatalf("%s: %d, %d, %d", tc.path, first.Code, replay.Code, reused.Code)
		}
		for i, w := range []http.Header{first.Header(), replay.Header(), reused.Header()} {
			if got := w.Get(claimclient.HeaderRetention); got != tc.want {
				t.Fatalf("%s response %d: %s = %q, want %s", tc.path, i, claimclient.HeaderRetention, got, tc.want)
			}
		}
	}
}

func TestMiddleware_StoreDownIs503(t *testing.T) {
	t.Parallel()
	for _, withRedis := range []bool{true, false} {
		t.Run(map[bool]string{true: "WithRedis", false: "WithoutRedis"}[withRedis], func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{redis: withRedis, tx: true})
			// A second store on a pool that is closed: every statement fails
			// as unreachable.
			pool, err := pgxpool.New(t.Context(), f.schema.URL)
			if err != nil {
				t.Fatal(err)
			}
			pool.Close()
			st, err := postgres.New(pool, postgres.WithSchema(f.schema.Name))
			if err != nil {
				t.Fatal(err)
			}
			var opts []claim.Option
			if withRedis {
				opts = f.redisOption()
			}
			c, err := claim.New[pgx.Tx](st, opts...)
			if err != nil {
				t.Fatal(err)
			}
			for _, tx := range []bool{true, false} {
				ran := false
				guard, err := claimhttp.Middleware(c, tenantOf, withMode(tx, claimhttp.WithOperation(func(*http.Request) string { return "POST /orders" }))...)
				if err != nil {
					t.Fatal(err)
				}
				h := authenticate(guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true })))
				w := httptestServe(h, newRequest("acme", http.MethodPost, "/orders", "k-down", `{"item":"book"}`))
				wantProblem(t, w, http.StatusServiceUnavailable, claimclient.ProblemUnavailable, "k-down")
				if w.Header().Get("Retry-After") == "" {
					t.Fatal("503 without Retry-After")
				}
				if ran {
					t.Fatal("handler ran without a durable claim")
				}
			}
		})
	}
}

func TestMiddleware_InProgress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy []claim.Option
		status int
	}{{"FailFastIs409", nil, http.StatusConflict}, {"PollIs202", []claim.Option{claim.WithPoll()}, http.StatusAccepted}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{redis: true, claim: tc.policy})
			entered, gate := make(chan struct{}), make(chan struct{})
			f.hook(func(n int64, r *http.Request) {
				if n == 1 {
					close(entered)
					<-gate
				}
			})
			var first *httptestRecorder
			var wg sync.WaitGroup
			wg.Go(func() { first = f.post("acme", "k-busy", `{"item":"book"}`) })
			<-entered
			dup := f.post("acme", "k-busy", `{"item":"book"}`)
			close(gate)
			wg.Wait()
			p := wantProblem(t, dup, tc.status, claimclient.ProblemInProgress, "k-busy")
			if ra, err := strconv.Atoi(dup.Header().Get("Retry-After")); err != nil || ra < 1 {
				t.Fatalf("Retry-After = %q", dup.Header().Get("Retry-After"))
			}
			if !strings.HasPrefix(p.OperationID, "op_") {
				t.Fatalf("operation_id = %q", p.OperationID)
			}
			loc := dup.Header().Get("Location")
			if tc.status == http.StatusAccepted && loc != "/operations/"+p.OperationID {
				t.Fatalf("Location = %q, want the operation resource", loc)
			}
			if tc.status == http.StatusConflict && loc != "" {
				t.Fatalf("409 with Location %q", loc)
			}
			if first.Code != http.StatusCreated {
				t.Fatalf("first = %d", first.Code)
			}
			var out orderOut
			decodeJSON(t, first.Body.Bytes(), &out)
			if out.Op != p.OperationID {
				t.Fatalf("handler saw operation %q, problem names %q", out.Op, p.OperationID)
			}
			if again := f.post("acme", "k-busy", `{"item":"book"}`); again.Body.String() != first.Body.String() {
				t.Fatal("the retry after completion is not the replay")
			}
		})
	}
}

func TestMiddleware_Uncertain(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	w := f.post("acme", "k-unsure", `{"item":"book","uncertain":true}`)
	p := wantProblem(t, w, http.StatusAccepted, claimclient.ProblemUncertain, "k-unsure")
	if w.Header().Get("Location") != "/operations/"+p.OperationID {
		t.Fatalf("Location = %q", w.Header().Get("Location"))
	}
	rec, err := f.record("acme", "k-unsure")
	if err != nil || rec.State != durable.Uncertain {
		t.Fatalf("record = %v, %v", rec.State, err)
	}
	runs := f.runs.Load()
	again := f.post("acme", "k-unsure", `{"item":"book","uncertain":true}`)
	wantProblem(t, again, http.StatusAccepted, claimclient.ProblemUncertain, "k-unsure")
	if f.runs.Load() != runs {
		t.Fatal("an uncertain operation ran again")
	}
	// Transaction-mode handlers cannot mark uncertain.
	if err := claimhttp.MarkUncertain(context.Background()); !errors.Is(err, claimhttp.ErrNotGuarded) {
		t.Fatalf("MarkUncertain outside = %v", err)
	}
}

// A worker whose lease expired and was taken over must not publish its
// response: the new owner's result is the operation's.
func TestMiddleware_FencedCompletionIsNotPublished(t *testing.T) {
	t.Parallel()
	for _, withRedis := range []bool{true, false} {
		t.Run(map[bool]string{true: "WithRedis", false: "WithoutRedis"}[withRedis], func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{redis: withRedis})
			entered, gate := make(chan struct{}), make(chan struct{})
			f.hook(func(n int64, r *http.Request) {
				if n == 1 {
					close(entered)
					<-gate
				}
			})
			var stale *httptestRecorder
			var wg sync.WaitGroup
			wg.Go(func() { stale = f.post("acme", "k-stale", `{"item":"book"}`) })
			<-entered
			f.expireLease("acme", "k-stale")
			fresh := f.post("acme", "k-stale", `{"item":"book"}`) // takes over
			if fresh.Code != http.StatusCreated || fresh.Header().Get(claimclient.HeaderReplayed) != "" {
				t.Fatalf("takeover = %d %s", fresh.Code, fresh.Body)
			}
			close(gate)
			wg.Wait()
			wantProblem(t, stale, http.StatusConflict, claimclient.ProblemInProgress, "k-stale")
			replay := f.post("acme", "k-stale", `{"item":"book"}`)
			if replay.Body.String() != fresh.Body.String() || replay.Header().Get(claimclient.HeaderReplayed) != "true" {
				t.Fatalf("replay = %s, want the new owner's %s", replay.Body, fresh.Body)
			}
		})
	}
}

func TestMiddleware_LargeResponses(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{redis: true, tx: mode.tx, options: []claimhttp.Option{claimhttp.WithMaxStoredBody(1024), claimhttp.WithMaxResponseBody(8192)}})

			t.Run("BodyOverMaxStoredBodyIsOmittedFromReplays", func(t *testing.T) {
				first := f.post("acme", "k-large", `{"item":"book","size":2000}`)
				if first.Code != http.StatusCreated || first.Body.Len() < 2000 || first.Header().Get(claimclient.HeaderBodyOmitted) != "" {
					t.Fatalf("first = %d, %d bytes", first.Code, first.Body.Len())
				}
				again := f.post("acme", "k-large", `{"item":"book","size":2000}`)
				h := again.Header()
				if again.Code != http.StatusCreated || again.Body.Len() != 0 ||
					h.Get(claimclient.HeaderBodyOmitted) != "true" || h.Get(claimclient.HeaderReplayed) != "true" ||
					h.Get("Location") != first.Header().Get("Location") || h.Get("Content-Type") != "" {
					t.Fatalf("replay = %d %q %v", again.Code, again.Body, h)
				}
				rec, err := f.record("acme", "k-large")
				if err != nil || rec.Result.ResourceID != first.Header().Get("Location") {
					t.Fatalf("stored resource id = %q, %v", rec.Result.ResourceID, err)
				}
				if f.rows("acme") != 1 {
					t.Fatal("the large response ran twice")
				}
			})

			t.Run("BodyOverMaxResponseBody", func(t *testing.T) {
				// Transaction mode: 500 and rolled back, the key is free.
				// Workflow mode: the order exists, so the result is stored
				// by its status without its body, and the first client gets
				// exactly what every retry will.
				w := f.post("huge", "k-huge", `{"item":"book","size":9000}`)
				rec, err := f.record("huge", "k-huge")
				if mode.tx {
					wantProblem(t, w, http.StatusInternalServerError, claimclient.ProblemInternal, "k-huge")
					if !errors.Is(err, durable.ErrNotFound) || f.rows("huge") != 0 {
						t.Fatalf("record = %+v, %v, rows %d; want none", rec, err, f.rows("huge"))
					}
					return
				}
				if w.Code != http.StatusCreated || w.Body.Len() != 0 || w.Header().Get(claimclient.HeaderBodyOmitted) != "true" {
					t.Fatalf("first = %d %q %v", w.Code, w.Body, w.Header())
				}
				if err != nil || rec.State != durable.Completed || rec.Result.StatusCode != http.StatusCreated {
					t.Fatalf("record = %+v, %v; want completed 201", rec, err)
				}
				runs := f.runs.Load()
				again := f.post("huge", "k-huge", `{"item":"book","size":9000}`)
				if again.Code != http.StatusCreated || again.Header().Get(claimclient.HeaderReplayed) != "true" || f.runs.Load() != runs || f.rows("huge") != 1 {
					t.Fatalf("retry = %d %v; runs %d -> %d, rows %d", again.Code, again.Header(), runs, f.runs.Load(), f.rows("huge"))
				}
			})
		})
	}
}

func TestMiddleware_StreamingIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	var flushErr, hijackErr error
	guard, err := claimhttp.Middleware(f.c, tenantOf, claimhttp.WithOperation(func(*http.Request) string { return "POST /stream" }))
	if err != nil {
		t.Fatal(err)
	}
	h := authenticate(guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		flushErr = rc.Flush()
		_, _, hijackErr = rc.Hijack()
		w.WriteHeader(http.StatusCreated)
	})))
	w := httptestServe(h, newRequest("acme", http.MethodPost, "/stream", "k-stream", `{}`))
	if w.Code != http.StatusCreated || !errors.Is(flushErr, http.ErrNotSupported) || !errors.Is(hijackErr, http.ErrNotSupported) {
		t.Fatalf("status %d, Flush %v, Hijack %v", w.Code, flushErr, hijackErr)
	}
}

// A middleware that cannot name the route (it wraps a whole mux, or the
// router sets no r.Pattern) refuses rather than name the operation by the
// raw path, which would make every resource id an operation of its own.
func TestMiddleware_NoRoutePatternIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	guard, err := claimhttp.Middleware(f.c, tenantOf)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/refunds", f.orders)
	h := authenticate(guard(mux)) // around the mux: r.Pattern is not set yet
	runs := f.runs.Load()
	w := httptestServe(h, newRequest("acme", http.MethodPost, "/orders/42/refunds", "k-mux", `{"item":"book"}`))
	wantProblem(t, w, http.StatusInternalServerError, claimclient.ProblemInternal, "k-mux")
	if f.runs.Load() != runs {
		t.Fatal("the handler ran without a named operation")
	}
	var n int
	if err := f.schema.Pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_requests`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("records = %d, %v; want nothing reserved", n, err)
	}

	// A router's own pattern names it: the same key on two resource ids is
	// one operation (a reuse with another payload is 422, not a second run).
	routed, err := claimhttp.Middleware(f.c, tenantOf, claimhttp.WithInTransaction(),
		claimhttp.WithOperation(func(r *http.Request) string { return r.Method + " " + patternOf(r) }))
	if err != nil {
		t.Fatal(err)
	}
	h = authenticate(fakeRouter("/orders/{id}/refunds", routed(http.HandlerFunc(f.orders))))
	first := httptestServe(h, newRequest("acme", http.MethodPost, "/orders/1/refunds", "k-routed", `{"item":"a"}`))
	second := httptestServe(h, newRequest("acme", http.MethodPost, "/orders/2/refunds", "k-routed", `{"item":"a"}`))
	if first.Code != http.StatusCreated || second.Code != http.StatusUnprocessableEntity {
		t.Fatalf("first = %d, second (another id, same key) = %d %s", first.Code, second.Code, second.Body)
	}
}

type patternKey struct{}

// fakeRouter stands for a router that matches pattern and records it in the
// request's context (as chi's RouteContext does) without setting r.Pattern.
func fakeRouter(pattern string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), patternKey{}, pattern)))
	})
}

func patternOf(r *http.Request) string {
	p, _ := r.Context().Value(patternKey{}).(string)
	return p
}

func TestMiddleware_OperationFromPattern(t *testing.T) {
	t.Parallel()
	f := setup(t, config{tx: true})
	w := f.post("acme", "k-op", `{"item":"book"}`)
	var out orderOut
	decodeJSON(t, w.Body.Bytes(), &out)
	ref, err := f.store.Ref(durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "k-op"})
	if err != nil {
		t.Fatal(err)
	}
	if out.Op != ref.OperationID() {
		t.Fatalf("operation id %q, want that of \"POST /orders\" %q", out.Op, ref.OperationID())
	}
}

func TestMiddleware_RejectsBadOptions(t *testing.T) {
	t.Parallel()
	store, err := postgres.New(testenvPoolless(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := claim.New[pgx.Tx](store)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		opts  []claimhttp.Option
		names string
	}{
		"BadHeader":          {[]claimhttp.Option{claimhttp.WithHeader("Idem Key")}, "WithHeader"},
		"EmptyMethods":       {[]claimhttp.Option{claimhttp.WithMethods()}, "WithMethods"},
		"BadMethod":          {[]claimhttp.Option{claimhttp.WithMethods("PO ST")}, "WithMethods"},
		"CanonOperation":     {[]claimhttp.Option{claimhttp.WithCanon(canon.Options{Operation: "x"})}, "WithCanon: Operation"},
		"CanonBadPointer":    {[]claimhttp.Option{claimhttp.WithCanon(canon.Options{Exclude: []string{"no-slash"}})}, "WithCanon"},
		"CanonNegativeBody":  {[]claimhttp.Option{claimhttp.WithCanon(canon.Options{MaxBody: -1})}, "WithCanon"},
		"StoredContentLen":   {[]claimhttp.Option{claimhttp.WithStoredHeaders("content-length")}, "WithStoredHeaders"},
		"StoredReplayMarker": {[]claimhttp.Option{claimhttp.WithStoredHeaders(claimclient.HeaderReplayed)}, "WithStoredHeaders"},
		"NegativeStored":     {[]claimhttp.Option{claimhttp.WithMaxStoredBody(-1)}, "WithMaxStoredBody"},
		"NegativeResponse":   {[]claimhttp.Option{claimhttp.WithMaxResponseBody(-1)}, "WithMaxResponseBody"},
		"ResponseUnderStore": {[]claimhttp.Option{claimhttp.WithMaxStoredBody(10), claimhttp.WithMaxResponseBody(5)}, "WithMaxResponseBody"},
		"NegativeRetry":      {[]claimhttp.Option{claimhttp.WithRetryAfter(-time.Second)}, "WithRetryAfter"},
		"NegativeFinish":     {[]claimhttp.Option{claimhttp.WithFinishTimeout(-time.Second)}, "WithFinishTimeout"},
		"EmptyOperationPath": {[]claimhttp.Option{claimhttp.WithOperationPath("")}, "WithOperationPath"},
		"NilOperation":       {[]claimhttp.Option{claimhttp.WithOperation(nil)}, "WithOperation"},
		"NilOptional":        {[]claimhttp.Option{claimhttp.WithOptional(nil)}, "WithOptional"},
		"NilLogger":          {[]claimhttp.Option{claimhttp.WithLogger(nil)}, "WithLogger"},
		"NilOption":          {[]claimhttp.Option{nil}, "nil Option"},
		"NegativeLease":      {[]claimhttp.Option{claimhttp.WithLease(-time.Second)}, "WithLease"},
		"LeaseUnderFloor":    {[]claimhttp.Option{claimhttp.WithLease(50 * time.Millisecond)}, "WithLease"},
	} {
		_, err := claimhttp.Middleware(c, tenantOf, tc.opts...)
		if !errors.Is(err, claimhttp.ErrConfig) || !strings.Contains(err.Error(), tc.names) {
			t.Errorf("%s: err = %v, want ErrConfig naming %s", name, err, tc.names)
		}
	}
	if _, err := claimhttp.Middleware(c, tenantOf, claimhttp.WithLease(50*time.Millisecond)); !errors.Is(err, claim.ErrInvalidLease) {
		t.Errorf("a lease under the floor: %v, want claim.ErrInvalidLease", err)
	}
	if _, err := claimhttp.Middleware(c, nil); !errors.Is(err, claimhttp.ErrConfig) || !strings.Contains(err.Error(), "tenant") {
		t.Errorf("nil tenant function: %v", err)
	}
	if _, err := claimhttp.Middleware[pgx.Tx](nil, tenantOf); !errors.Is(err, claimhttp.ErrConfig) {
		t.Errorf("nil Claimer: %v", err)
	}
	if _, err := claimhttp.Middleware(c, tenantOf, claimhttp.WithStoredHeaders(), claimhttp.WithMaxStoredBody(10), claimhttp.WithMaxResponseBody(10)); err != nil {
		t.Errorf("valid options: %v", err)
	}
}

// WithLease is the lease of the middleware's claims: the record's lease,
// read while the handler runs, is the route's 7s, not the Claimer's 30s;
// without it, the Claimer's (the negative control).
func TestMiddleware_RouteLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		opts     []claimhttp.Option
		min, max time.Duration
	}{
		{"WithLease", []claimhttp.Option{claimhttp.WithLease(7 * time.Second)}, 5 * time.Second, 7 * time.Second},
		{"ClaimersLease", nil, 25 * time.Second, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{claim: []claim.Option{claim.WithLease(30 * time.Second)}, options: tc.opts})
			var left atomic.Int64
			f.hook(func(_ int64, r *http.Request) {
				var ms float64
				err := f.schema.Pool.QueryRow(r.Context(), `SELECT EXTRACT(EPOCH FROM lease_expires_at - clock_timestamp()) * 1000
					FROM `+f.schema.Name+`.idempotency_requests WHERE state = 'processing'`).Scan(&ms)
				if err != nil {
					t.Error(err)
				}
				left.Store(int64(ms))
			})
			if w := f.post("acme", "k-lease", `{"item":"book"}`); w.Code != http.StatusCreated {
				t.Fatalf("first request: %d %s", w.Code, w.Body)
			}
			if got := time.Duration(left.Load()) * time.Millisecond; got < tc.min || got > tc.max {
				t.Fatalf("lease left while the handler ran: %v, want %v to %v", got, tc.min, tc.max)
			}
		})
	}
}
