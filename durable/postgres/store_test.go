package postgres_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/headers"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/testenv"
)

const fp = "v1:fingerprint"

func scope() durable.Scope {
	return durable.Scope{Tenant: "tenant", Operation: "POST /orders", Key: testenv.Name("k-")}
}

func claimParams(sc durable.Scope, lease time.Duration) storeapi.ClaimParams {
	return storeapi.ClaimParams{Scope: sc, Fingerprint: fp, Owner: uuid.New(), Lease: lease, Retention: time.Hour}
}

func ctxOf(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func acquire(t testing.TB, s storeapi.Store[pgx.Tx], p storeapi.ClaimParams) fence.Token {
	t.Helper()
	res, err := s.Claim(ctxOf(t), nil, p)
	if err != nil || !res.Acquired {
		t.Fatalf("Claim = %+v, %v; want acquired", res, err)
	}
	return res.Token
}

var result = durable.Result{StatusCode: 201, Body: []byte(`{"id":1}`), Version: 1, ResourceID: "ord_1",
	Headers: map[string][]string{"Content-Type": {"application/json"}, "Etag": {"\"\x80\xfe\xff\""}}}

// secondStore opens another store on f's schema with its own pool and
// statement counter (and f's application_name, so f.lockWaiters sees it).
func secondStore(t testing.TB, f *fixture, opts ...postgres.Option) (storeapi.Store[pgx.Tx], *testenv.StatementCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(f.schema.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.ConfigurePool(cfg, opts...); err != nil {
		t.Fatal(err)
	}
	c := &testenv.StatementCounter{}
	cfg.ConnConfig.Tracer = c
	cfg.ConnConfig.RuntimeParams["application_name"] = f.app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s.(storeapi.Store[pgx.Tx]), c
}

func waitLockWaiter(t testing.TB, f *fixture) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for f.lockWaiters() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no session ever waited for the row lock")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestNew_RejectsInvalidOptions(t *testing.T) {
	if _, err := postgres.New(nil); !errors.Is(err, postgres.ErrConfig) {
		t.Fatalf("New(nil) = %v; want ErrConfig", err)
	}
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for name, opt := range map[string]postgres.Option{
		"table with capitals":   postgres.WithTable("Bad"),
		"table with a dash":     postgres.WithTable("a-b"),
		"table too long":        postgres.WithTable(strings.Repeat("a", 51)),
		"table named as a type": postgres.WithTable("idempotency_state"),
		"table with a quote":    postgres.WithTable(`x"; DROP TABLE y; --`),
		"empty schema":          postgres.WithSchema(""),
		"schema with a space":   postgres.WithSchema("a b"),
		"empty secret":          postgres.WithKeySecret(nil),
		"zero lock timeout":     postgres.WithLockTimeout(0),
		"lock timeout of 30s":   postgres.WithLockTimeout(30 * time.Second),
		"lock timeout of 1h":    postgres.WithLockTimeout(time.Hour),
		"tiny idle timeout":     postgres.WithIdleInTxTimeout(time.Microsecond),
	} {
		if _, err := postgres.New(pool, opt); !errors.Is(err, postgres.ErrConfig) {
			t.Errorf("New with %s = %v; want ErrConfig", name, err)
		}
	}
	for name, opt := range map[string]postgres.Option{
		"lock timeout just under 30s": postgres.WithLockTimeout(30*time.Second - time.Millisecond),
		"lock timeout of 1ms":         postgres.WithLockTimeout(time.Millisecond),
	} {
		if _, err := postgres.New(pool, opt); err != nil {
			t.Errorf("New with %s = %v; want it accepted", name, err)
		}
	}
	if _, err := postgres.New(pool, postgres.WithSchema("app"), postgres.WithTable("keys")); err != nil {
		t.Fatalf("New = %v", err)
	}
	if err := postgres.Migrate(context.Background(), nil); !errors.Is(err, postgres.ErrConfig) {
		t.Fatalf("Migrate(nil) = %v; want ErrConfig", err)
	}
	if err := postgres.Migrate(context.Background(), pool, postgres.WithTable("Bad")); !errors.Is(err, postgres.ErrConfig) {
		t.Fatalf("Migrate with a bad table = %v; want ErrConfig", err)
	}
}

func TestConfigurePool_SetsSessionTimeouts(t *testing.T) {
	if err := postgres.ConfigurePool(nil); !errors.Is(err, postgres.ErrConfig) {
		t.Fatalf("ConfigurePool(nil) = %v; want ErrConfig", err)
	}
	sch := testenv.Postgres(t)
	cfg, err := pgxpool.ParseConfig(sch.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.ConfigurePool(cfg, postgres.WithLockTimeout(250*time.Millisecond), postgres.WithIdleInTxTimeout(7*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := cfg.ConnConfig.RuntimeParams["lock_timeout"]; got != "250" {
		t.Fatalf("lock_timeout param %q; want 250", got)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var lock, idle string
	if err := pool.QueryRow(ctxOf(t), "SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')").Scan(&lock, &idle); err != nil {
		t.Fatal(err)
	}
	if lock != "250ms" || idle != "7s" {
		t.Fatalf("session lock_timeout %q, idle_in_transaction_session_timeout %q; want 250ms and 7s", lock, idle)
	}

	// A parameter already set is the caller's choice and stays.
	cfg2, _ := pgxpool.ParseConfig(sch.URL + "&lock_timeout=900")
	if err := postgres.ConfigurePool(cfg2); err != nil {
		t.Fatal(err)
	}
	if got := cfg2.ConnConfig.RuntimeParams["lock_timeout"]; got != "900" {
		t.Fatalf("ConfigurePool overwrote lock_timeout=900 with %q", got)
	}
}

func TestStore_InTxSetsTimeoutsLocally(t *testing.T) {
	f := newFixture(t, fixtureOpts{unconfigured: true,
		opts: []postgres.Option{postgres.WithLockTimeout(1234 * time.Millisecond), postgres.WithIdleInTxTimeout(4321 * time.Millisecond)}})
	var lock, idle, iso string
	err := f.s.InTx(ctxOf(t), func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout'), current_setting('transaction_isolation')").Scan(&lock, &idle, &iso)
	})
	if err != nil {
		t.Fatal(err)
	}
	if lock != "1234ms" || idle != "4321ms" || iso != "read committed" {
		t.Fatalf("in InTx: lock_timeout %q, idle %q, isolation %q", lock, idle, iso)
	}
	// SET LOCAL: the session itself is unchanged afterwards.
	if err := f.pool.QueryRow(ctxOf(t), "SELECT current_setting('lock_timeout')").Scan(&lock); err != nil || lock != "0" {
		t.Fatalf("session lock_timeout after InTx = %q, %v; want the server default 0", lock, err)
	}
}

// A paused worker holding a row lock in an open transaction blocks a new
// claimer for at most lock_timeout per attempt (ErrUnavailable, SQLSTATE
// 55P03), and only until idle_in_transaction_session_timeout ends the
// paused session; then a new owner acquires.
func TestStore_PausedTransactionDoesNotBlockForever(t *testing.T) {
	// The idle timeout must outlast the step from the pause to the first
	// claim below on a loaded machine (600ms did not, once, under -race
	// with the model checker running).
	const idle = 2 * time.Second
	opts := []postgres.Option{postgres.WithLockTimeout(100 * time.Millisecond), postgres.WithIdleInTxTimeout(idle)}
	for _, tc := range []struct {
		name         string
		unconfigured bool
		ownTx        bool // the caller's own pool.Begin instead of InTx
	}{
		{"ConfiguredPoolCallerTx", false, true},
		{"ConfiguredPoolInTx", false, false},
		{"UnconfiguredPoolInTx", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, fixtureOpts{unconfigured: tc.unconfigured, opts: opts})
			ctx := ctxOf(t)
			sc := scope()
			held := make(chan error, 1)
			resume := make(chan struct{})
			var once sync.Once
			wake := func() { once.Do(func() { close(resume) }) }
			t.Cleanup(wake) // before the pool closes, even when the test fails
			pause := func(ctx context.Context, tx pgx.Tx) error {
				res, err := f.s.Claim(ctx, tx, claimParams(sc, time.Hour))
				if err != nil || !res.Acquired {
					return fmt.Errorf("claim in tx = %+v, %v", res, err)
				}
				held <- nil
				<-resume // the worker pauses with the row locked
				return nil
			}
			finished := make(chan error, 1)
			if tc.ownTx {
				tx, err := f.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					err := pause(ctx, tx)
					if err == nil {
						err = tx.Commit(ctx)
					}
					finished <- err
				}()
			} else {
				go func() { finished <- f.s.InTx(ctx, pause) }()
			}
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			paused := time.Now()

			// While the paused transaction lives: bounded by lock_timeout.
			_, err := f.s.Claim(ctx, nil, claimParams(sc, time.Hour))
			var pgErr *pgconn.PgError
			if !errors.Is(err, durable.ErrUnavailable) || !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
				t.Fatalf("claim behind a paused transaction (%v after the pause; idle timeout %v) = %v; want ErrUnavailable wrapping lock_timeout (55P03)",
					time.Since(paused).Round(time.Millisecond), idle, err)
			}
			// Then the server ends the idle session and a new owner acquires.
			deadline := time.Now().Add(20 * time.Second)
			for {
				res, err := f.s.Claim(ctx, nil, claimParams(sc, time.Hour))
				if err == nil && res.Acquired {
					break
				}
				if err != nil && !errors.Is(err, durable.ErrUnavailable) {
					t.Fatalf("claim = %v; want ErrUnavailable while blocked", err)
				}
				if err == nil {
					t.Fatalf("claim saw %+v; the paused claim must never commit", res.Record)
				}
				if time.Now().After(deadline) {
					t.Fatal("the paused transaction blocked the key for good")
				}
			}
			wake()
			if err := <-finished; err == nil {
				t.Fatal("the paused transaction committed after its session was ended")
			}
		})
	}
}

// A claim that waited on a row updated by a concurrent transaction reports
// the version that transaction committed (FOR SHARE), not the statement's
// snapshot, in one statement; one that waited on a row inserted after its
// snapshot reads it again (two statements).
func TestStore_ClaimAfterWaitingSeesTheCommittedVersion(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	other, stmts := secondStore(t, f)
	ctx := ctxOf(t)

	run := func(prepare func(tx pgx.Tx) fence.Token, sc durable.Scope) (storeapi.ClaimResult, fence.Token, int64) {
		t.Helper()
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		tok := prepare(tx)
		type out struct {
			res storeapi.ClaimResult
			err error
			n   int64
		}
		done := make(chan out, 1)
		go func() {
			before := stmts.Count()
			res, err := other.Claim(ctx, nil, claimParams(sc, time.Hour))
			done <- out{res, err, stmts.Count() - before}
		}()
		waitLockWaiter(t, f)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		o := <-done
		if o.err != nil {
			t.Fatal(o.err)
		}
		return o.res, tok, o.n
	}

	// The row exists and a transaction completes it while the claim waits.
	sc := scope()
	ref, _ := f.s.Ref(sc)
	first := acquire(t, f.s, claimParams(sc, time.Hour))
	res, tok, n := run(func(tx pgx.Tx) fence.Token {
		if err := f.s.Complete(ctx, tx, ref, first, result); err != nil {
			t.Fatal(err)
		}
		return first
	}, sc)
	if res.Acquired || res.Record == nil || res.Record.State != durable.Completed || res.Record.Token != tok || n != 1 {
		t.Fatalf("claim after waiting on an update = %+v (%d statements); want the completed record in 1 statement", res, n)
	}

	// The row is inserted by a transaction that commits while the claim waits.
	sc = scope()
	res, tok, n = run(func(tx pgx.Tx) fence.Token {
		r, err := f.s.Claim(ctx, tx, claimParams(sc, time.Hour))
		if err != nil || !r.Acquired {
			t.Fatalf("Claim in tx = %+v, %v", r, err)
		}
		return r.Token
	}, sc)
	if res.Acquired || res.Record == nil || res.Record.State != durable.Processing || res.Record.Token != tok || n != 2 {
		t.Fatalf("claim after waiting on an insert = %+v (%d statements); want the processing record, read again (2 statements)", res, n)
	}
}

// When the connection is lost after a write was sent and the server applied
// it, the store re-reads the record and reports the truth.
func TestStore_AmbiguousWritesAreResolvedByReading(t *testing.T) {
	for _, unconfigured := range []bool{false, true} {
		t.Run(fmt.Sprintf("unconfigured=%v", unconfigured), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, fixtureOpts{proxy: true, unconfigured: unconfigured})
			s, ctx := f.s, ctxOf(t)
			cuts := int64(0)
			lost := func(what string) {
				t.Helper()
				cuts++
				if got := f.proxy.Cuts(); got != cuts {
					t.Fatalf("%s: the proxy lost %d replies; want %d (the test did not cut)", what, got, cuts)
				}
			}

			sc := scope()
			ref, _ := s.Ref(sc)
			p := claimParams(sc, time.Hour)
			f.proxy.Arm(pgproxy.CutStatement)
			res, err := s.Claim(ctx, nil, p)
			lost("Claim")
			if err != nil || !res.Acquired || res.Token.Owner != p.Owner {
				t.Fatalf("Claim with a lost reply = %+v, %v; want acquired by re-reading", res, err)
			}
			tok := res.Token

			f.proxy.Arm(pgproxy.CutStatement)
			err = s.Renew(ctx, ref, tok, time.Hour)
			lost("Renew")
			if !errors.Is(err, durable.ErrUnavailable) {
				t.Fatalf("Renew with a lost reply = %v; want ErrUnavailable (a renewal cannot be inferred)", err)
			}
			if err := s.Renew(ctx, ref, tok, time.Hour); err != nil {
				t.Fatalf("retried Renew = %v", err)
			}

			f.proxy.Arm(pgproxy.CutStatement)
			err = s.Complete(ctx, nil, ref, tok, result)
			lost("Complete")
			if err != nil {
				t.Fatalf("Complete with a lost reply = %v; want success by re-reading", err)
			}
			if rec, err := s.Get(ctx, ref); err != nil || rec.State != durable.Completed {
				t.Fatalf("Get = %+v, %v", rec, err)
			}

			// A fenced write whose reply is lost stays fenced.
			stale := fence.Token{Generation: tok.Generation, Owner: uuid.New()}
			f.proxy.Arm(pgproxy.CutStatement)
			err = s.Complete(ctx, nil, ref, stale, result)
			lost("stale Complete")
			if !errors.Is(err, durable.ErrFenced) {
				t.Fatalf("stale Complete with a lost reply = %v; want ErrFenced", err)
			}

			sc = scope()
			ref, _ = s.Ref(sc)
			tok = acquire(t, s, claimParams(sc, time.Hour))
			f.proxy.Arm(pgproxy.CutStatement)
			err = s.MarkUncertain(ctx, ref, tok)
			lost("MarkUncertain")
			if err != nil {
				t.Fatalf("MarkUncertain with a lost reply = %v", err)
			}
			r := uuid.New()
			f.proxy.Arm(pgproxy.CutStatement)
			adopted, err := s.Adopt(ctx, ref, r, 0, time.Hour)
			lost("Adopt")
			if err != nil || adopted.Owner != r || adopted.Generation != tok.Generation+1 {
				t.Fatalf("Adopt with a lost reply = %v, %v", adopted, err)
			}
			f.proxy.Arm(pgproxy.CutStatement)
			err = s.Fail(ctx, nil, ref, adopted, result)
			lost("Fail")
			if err != nil {
				t.Fatalf("Fail with a lost reply = %v", err)
			}

			sc = scope()
			ref, _ = s.Ref(sc)
			tok = acquire(t, s, claimParams(sc, time.Hour))
			f.proxy.Arm(pgproxy.CutStatement)
			err = s.Release(ctx, nil, ref, tok)
			lost("Release")
			if err != nil {
				t.Fatalf("Release with a lost reply = %v", err)
			}
			if rec, err := s.Get(ctx, ref); err != nil || !rec.Released {
				t.Fatalf("Get after Release = %+v, %v", rec, err)
			}
		})
	}
}

func TestStore_ClosedPoolIsUnavailable(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	sc := scope()
	ref, _ := f.s.Ref(sc)
	tok := acquire(t, f.s, claimParams(sc, time.Hour))
	f.pool.Close()
	ctx := ctxOf(t)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, durable.ErrUnavailable) || !errors.Is(err, puddle.ErrClosedPool) {
			t.Errorf("%s on a closed pool = %v; want ErrUnavailable wrapping the closed pool", what, err)
		}
	}
	_, err := f.s.Claim(ctx, nil, claimParams(sc, time.Hour))
	check("Claim", err)
	check("Complete", f.s.Complete(ctx, nil, ref, tok, result))
	check("Fail", f.s.Fail(ctx, nil, ref, tok, result))
	check("Renew", f.s.Renew(ctx, ref, tok, time.Hour))
	check("MarkUncertain", f.s.MarkUncertain(ctx, ref, tok))
	check("Release", f.s.Release(ctx, nil, ref, tok))
	_, err = f.s.Adopt(ctx, ref, uuid.New(), 0, time.Hour)
	check("Adopt", err)
	_, err = f.s.Get(ctx, ref)
	check("Get", err)
	_, err = f.s.Pending(ctx, 0, 1)
	check("Pending", err)
	_, err = f.s.Sweep(ctx, 1)
	check("Sweep", err)
	_, err = f.s.Stats(ctx)
	check("Stats", err)
	check("InTx", f.s.InTx(ctx, func(context.Context, pgx.Tx) error { return nil }))
	check("Migrate", postgres.Migrate(ctx, f.pool, f.opts...))
}

func TestStore_RefusedConnectionWrapsTheCause(t *testing.T) {
	s := unreachable(t)
	_, err := s.Get(ctxOf(t), durable.Ref{})
	var connErr *pgconn.ConnectError
	if !errors.Is(err, durable.ErrUnavailable) || !errors.As(err, &connErr) {
		t.Fatalf("Get on a refused connection = %v; want ErrUnavailable wrapping *pgconn.ConnectError", err)
	}
}

// The raw key is never written: the row holds SHA-256(key), or
// HMAC-SHA-256(secret, key) with WithKeySecret.
func TestStore_KeyIsStoredOnlyAsItsHash(t *testing.T) {
	secret := []byte("a secret of the deployment")
	f := newFixture(t, fixtureOpts{opts: []postgres.Option{postgres.WithKeySecret(secret)}})
	ctx := ctxOf(t)
	sc := durable.Scope{Tenant: "tenant", Operation: "POST /orders", Key: "raw-client-key-8c1d2e"}
	tok := acquire(t, f.s, claimParams(sc, time.Hour))
	ref, _ := f.s.Ref(sc)
	if err := f.s.Complete(ctx, nil, ref, tok, result); err != nil {
		t.Fatal(err)
	}
	var dump string
	var keyHash []byte
	if err := f.pool.QueryRow(ctx, "SELECT t::text, key_hash FROM idempotency_requests t").Scan(&dump, &keyHash); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(dump, sc.Key) || strings.Contains(strings.ToLower(dump), fmt.Sprintf("%x", sc.Key)) {
		t.Fatalf("the raw key is in the row: %s", dump)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(sc.Key))
	if !hmac.Equal(keyHash, m.Sum(nil)) {
		t.Fatalf("key_hash %x; want HMAC-SHA-256(secret, key)", keyHash)
	}
	// A store without the secret addresses another record.
	plain, err := postgres.New(f.pool)
	if err != nil {
		t.Fatal(err)
	}
	pref, _ := plain.Ref(sc)
	if sum := sha256.Sum256([]byte(sc.Key)); pref.KeyHash != sum {
		t.Fatal("without a secret the key hash is not SHA-256(key)")
	}
	if _, err := plain.Get(ctx, pref); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("Get without the secret = %v; want ErrNotFound", err)
	}
}

// A restart past retention clears every stored result column, not only what
// Get shows.
func TestStore_RestartClearsTheStoredResult(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := ctxOf(t)
	sc := scope()
	ref, _ := f.s.Ref(sc)
	p := claimParams(sc, time.Hour)
	p.Retention = 20 * time.Millisecond
	tok := acquire(t, f.s, p)
	if err := f.s.Complete(ctx, nil, ref, tok, result); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		rec, err := f.s.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if rec.ExpiresIn <= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("retention never passed")
		}
	}
	res, err := f.s.Claim(ctx, nil, claimParams(sc, time.Hour))
	if err != nil || !res.Restarted {
		t.Fatalf("Claim = %+v, %v; want a restart", res, err)
	}
	var cleared bool
	err = f.pool.QueryRow(ctx, `SELECT status_code IS NULL AND response_headers IS NULL AND response_body IS NULL
		AND response_version IS NULL AND resource_id IS NULL AND completed_at IS NULL FROM idempotency_requests`).Scan(&cleared)
	if err != nil || !cleared {
		t.Fatalf("result columns cleared = %v, %v; want true", cleared, err)
	}
}

// Claim + Complete inside the caller's transaction is one transaction:
// BEGIN, claim, complete, COMMIT.
func TestStore_ClaimCompleteInTxIsOneTransaction(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	sc := scope()
	before := f.stmts.Count()
	err := f.s.InTx(ctxOf(t), func(ctx context.Context, tx pgx.Tx) error {
		res, err := f.s.Claim(ctx, tx, claimParams(sc, time.Hour))
		if err != nil {
			return err
		}
		return f.s.Complete(ctx, tx, res.Ref, res.Token, result)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := f.stmts.Count() - before; n != 4 {
		t.Fatalf("InTx(Claim, Complete) took %d statements; want 4 (BEGIN, claim, complete, COMMIT)", n)
	}
}

// A nil pgx.Tx (the zero TTx) runs each write on its own: it commits
// without a transaction of the caller's.
func TestStore_NilTxWritesOnItsOwn(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := ctxOf(t)
	p := claimParams(scope(), time.Hour)
	res, err := f.s.Claim(ctx, nil, p)
	if err != nil || !res.Acquired {
		t.Fatalf("Claim(nil tx) = %+v, %v; want acquired", res, err)
	}
	if err := f.s.Complete(ctx, nil, res.Ref, res.Token, result); err != nil {
		t.Fatalf("Complete(nil tx) = %v", err)
	}
	if rec, err := f.s.Get(ctx, res.Ref); err != nil || rec.State != durable.Completed {
		t.Fatalf("Get = %+v, %v; want completed", rec, err)
	}
}

// Many instances start at once: 8 concurrent Migrate calls on a fresh schema
// all succeed (the advisory lock serializes them), and the result works.
func TestMigrate_ConcurrentInstances(t *testing.T) {
	sch := testenv.Postgres(t)
	cfg, err := pgxpool.ParseConfig(sch.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := ctxOf(t)
	named := testenv.Name("m_") // a schema that does not exist yet
	t.Cleanup(func() { _, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+named+" CASCADE") })
	for _, opts := range [][]postgres.Option{nil, {postgres.WithSchema(named), postgres.WithTable("keys")}} {
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() {
				errs[i] = postgres.Migrate(ctx, pool, opts...)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("Migrate #%d with %d options: %v", i, len(opts), err)
			}
		}
		if err := postgres.Migrate(ctx, pool, opts...); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		s, err := postgres.New(pool, opts...)
		if err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		acquire(t, s.(storeapi.Store[pgx.Tx]), claimParams(scope(), time.Hour))
	}
	var reg *string
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::text", named+".keys").Scan(&reg); err != nil || reg == nil {
		t.Fatalf("table %s.keys = %v, %v; want it created in the schema", named, reg, err)
	}
}

// The embedded files are plain SQL: down drops what up created, and up runs
// again after it.
func TestMigrate_DownThenUp(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := ctxOf(t)
	down, err := fs.ReadFile(postgres.Migrations(), "001_create_idempotency_requests.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.ReadFile(postgres.Migrations(), "001_create_idempotency_requests.up.sql"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, string(down)); err != nil {
		t.Fatalf("down: %v", err)
	}
	var table, typ *string
	if err := f.pool.QueryRow(ctx, "SELECT to_regclass('idempotency_requests')::text, to_regtype('idempotency_state')::text").Scan(&table, &typ); err != nil {
		t.Fatal(err)
	}
	if table != nil || typ != nil {
		t.Fatalf("after down: table %v, type %v; want both gone", table, typ)
	}
	if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
		t.Fatalf("up again: %v", err)
	}
	acquire(t, f.s, claimParams(scope(), time.Hour))
}

// A claim whose reply is lost because the caller's context was cancelled
// (a client that went away) is still resolved: the re-read runs on a
// context detached from the caller's, so the caller learns that it holds
// the key instead of leaving it blocked for a lease (issue 13, item 11a).
func TestStore_AmbiguousClaimIsResolvedAfterTheCallerCancelled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{proxy: true})
	sc := scope()
	ref, _ := f.s.Ref(sc)
	p := claimParams(sc, time.Hour)
	ctx, cancel := context.WithCancel(ctxOf(t))
	defer cancel()
	f.proxy.ArmThen(pgproxy.CutStatement, cancel) // the claim applied; the caller goes away
	res, err := f.s.Claim(ctx, nil, p)
	if f.proxy.Cuts() != 1 {
		t.Fatal("the proxy did not cut the claim's reply")
	}
	if ctx.Err() == nil {
		t.Fatal("the caller's context was not cancelled")
	}
	if err != nil || !res.Acquired || res.Token.Owner != p.Owner {
		t.Fatalf("Claim whose caller cancelled after it applied = %+v, %v; want acquired, learnt by re-reading", res, err)
	}
	// The caller can act on the truth: here it releases the key at once.
	if err := f.s.Release(ctxOf(t), nil, ref, res.Token); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if r, err := f.s.Claim(ctxOf(t), nil, claimParams(sc, time.Hour)); err != nil || !r.Acquired {
		t.Fatalf("claim after the release = %+v, %v; want acquired", r, err)
	}

	// A fenced write and an adoption resolve the same way.
	sc = scope()
	ref, _ = f.s.Ref(sc)
	tok := acquire(t, f.s, claimParams(sc, time.Hour))
	ctx, cancel = context.WithCancel(ctxOf(t))
	f.proxy.ArmThen(pgproxy.CutStatement, cancel)
	if err := f.s.MarkUncertain(ctx, ref, tok); err != nil {
		t.Fatalf("MarkUncertain whose caller cancelled after it applied = %v; want success by re-reading", err)
	}
	ctx, cancel = context.WithCancel(ctxOf(t))
	f.proxy.ArmThen(pgproxy.CutStatement, cancel)
	owner := uuid.New()
	adopted, err := f.s.Adopt(ctx, ref, owner, 0, time.Hour)
	if err != nil || adopted.Owner != owner {
		t.Fatalf("Adopt whose caller cancelled after it applied = %v, %v; want adopted by re-reading", adopted, err)
	}
	ctx, cancel = context.WithCancel(ctxOf(t))
	f.proxy.ArmThen(pgproxy.CutStatement, cancel)
	if err := f.s.Complete(ctx, nil, ref, adopted, result); err != nil {
		t.Fatalf("Complete whose caller cancelled after it applied = %v; want success by re-reading", err)
	}
	if f.proxy.Cuts() != 4 {
		t.Fatalf("the proxy cut %d replies; want 4", f.proxy.Cuts())
	}
}

// A fenced write whose reply was lost, and that was then followed by other
// writes (a Release then a new claim; a MarkUncertain then an adoption), is
// not reported as ErrFenced ("did not apply") when it may have applied: the
// outcome is unknown (ErrUnavailable). ErrFenced stays for a write the
// re-read proves did not apply (issue 13, item 11c).
func TestStore_LostReplyThenNewOwnerIsUnknownNotFenced(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{proxy: true})
	other, _ := secondStore(t, f) // not behind the proxy
	ctx := ctxOf(t)

	// Release applied, its reply lost, and a new claim took the key.
	sc := scope()
	ref, _ := f.s.Ref(sc)
	tok := acquire(t, f.s, claimParams(sc, time.Hour))
	claimed := make(chan fence.Token, 1)
	f.proxy.ArmThen(pgproxy.CutStatement, func() {
		res, err := other.Claim(ctx, nil, claimParams(sc, time.Hour))
		if err != nil || !res.Acquired {
			t.Errorf("the new claim after the release = %+v, %v", res, err)
		}
		claimed <- res.Token
	})
	err := f.s.Release(ctx, nil, ref, tok)
	if next := <-claimed; next.Generation <= tok.Generation {
		t.Fatalf("the new claim after the release got %v", next)
	}
	if !errors.Is(err, durable.ErrUnavailable) || errors.Is(err, durable.ErrFenced) {
		t.Fatalf("Release that applied, then a new claim = %v; want ErrUnavailable (outcome unknown), not ErrFenced", err)
	}

	// MarkUncertain applied, its reply lost, and the reconciler adopted it.
	sc = scope()
	ref, _ = f.s.Ref(sc)
	tok = acquire(t, f.s, claimParams(sc, time.Hour))
	f.proxy.ArmThen(pgproxy.CutStatement, func() {
		if _, err := other.Adopt(ctx, ref, uuid.New(), 0, time.Hour); err != nil {
			t.Errorf("Adopt: %v", err)
		}
	})
	err = f.s.MarkUncertain(ctx, ref, tok)
	if !errors.Is(err, durable.ErrUnavailable) || errors.Is(err, durable.ErrFenced) {
		t.Fatalf("MarkUncertain that applied, then an adoption = %v; want ErrUnavailable (outcome unknown), not ErrFenced", err)
	}
	if rec, _ := f.s.Get(ctx, ref); rec.State != durable.Uncertain || rec.Token.Generation != tok.Generation+1 {
		t.Fatalf("record %+v; want uncertain and adopted", rec)
	}

	// Proven not applied: a token the record never had (another owner at
	// its generation) stays ErrFenced after a lost reply.
	stale := fence.Token{Generation: tok.Generation + 1, Owner: uuid.New()}
	f.proxy.Arm(pgproxy.CutStatement)
	if err := f.s.Complete(ctx, nil, ref, stale, result); !errors.Is(err, durable.ErrFenced) {
		t.Fatalf("Complete with a token the record never had, reply lost = %v; want ErrFenced", err)
	}
	// And so does a write of a generation the record never reached.
	f.proxy.Arm(pgproxy.CutStatement)
	if err := f.s.Release(ctx, nil, ref, fence.Token{Generation: tok.Generation + 5, Owner: tok.Owner}); !errors.Is(err, durable.ErrFenced) {
		t.Fatalf("Release of a generation above the record's, reply lost = %v; want ErrFenced", err)
	}
	if n := f.proxy.Cuts(); n != 4 {
		t.Fatalf("the proxy cut %d replies; want 4", n)
	}
}

// A COMMIT the server answers with ROLLBACK (a statement of the transaction
// failed and fn still returned nil) committed nothing: InTx says so, not
// ErrUnavailable (issue 13, item 11b; the deferred-constraint case is in the
// contract suite).
func TestStore_InTxCommitAnsweredWithRollbackIsDefinite(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{})
	sc := scope()
	ref, _ := f.s.Ref(sc)
	err := f.s.InTx(ctxOf(t), func(ctx context.Context, tx pgx.Tx) error {
		res, err := f.s.Claim(ctx, tx, claimParams(sc, time.Hour))
		if err != nil {
			return err
		}
		if err := f.s.Complete(ctx, tx, ref, res.Token, result); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, "SELECT 1/0") // fails; the caller ignores it
		return nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InTx whose COMMIT was answered with ROLLBACK = %v; want pgx.ErrTxCommitRollback, not ErrUnavailable", err)
	}
	if _, err := f.s.Get(ctxOf(t), ref); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("Get = %v; want ErrNotFound (rolled back)", err)
	}

	// A deferred unique violation: the *pgconn.PgError is returned.
	if _, err := f.pool.Exec(ctxOf(t), `CREATE TABLE orders (id integer,
		CONSTRAINT orders_id_key UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	err = f.s.InTx(ctxOf(t), func(ctx context.Context, tx pgx.Tx) error {
		res, err := f.s.Claim(ctx, tx, claimParams(sc, time.Hour))
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES (1), (1)"); err != nil {
			return err
		}
		return f.s.Complete(ctx, tx, ref, res.Token, result)
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InTx with a deferred unique violation = %v; want the *pgconn.PgError 23505, not ErrUnavailable", err)
	}
	if _, err := f.s.Get(ctxOf(t), ref); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("Get = %v; want ErrNotFound (rolled back)", err)
	}
}

// Migration 002 converts the rows of an existing table: retention_us from
// expires_at - created_at, and the jsonb headers to the byte-for-byte
// encoding, exactly as the store's Go code encodes them. Rows a previous
// version writes afterwards (neither column) are still read and finished
// correctly. It is idempotent through Migrate, and reversible.
func TestMigrate_002ConvertsExistingRows(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOpts{noMigrate: true})
	ctx := ctxOf(t)
	up1, err := fs.ReadFile(postgres.Migrations(), "001_create_idempotency_requests.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, string(up1)); err != nil {
		t.Fatalf("001 up: %v", err)
	}
	legacy := map[string][]string{
		"Content-Type": {"application/json"},
		"Set-Cookie":   {"a=1", "b=2", ""},
		"X-Empty":      {},
		"\u00c9tag":    {"\u00e9t\u00e9", "10:"},
		"A":            {"first by bytes"},
	}
	legacyJSON, _ := json.Marshal(legacy)
	// insert writes a row as the version before 002 did.
	insert := func(state string, hdrs []byte, retention time.Duration) (durable.Ref, fence.Token) {
		t.Helper()
		sc := scope()
		ref, _ := f.s.Ref(sc)
		tok := fence.Token{Generation: 7, Owner: uuid.New()}
		var status any
		if state == "completed" {
			status = 201
		}
		_, err := f.pool.Exec(ctx, `INSERT INTO idempotency_requests (tenant_id, operation, key_hash, request_hash, state,
			generation, owner_token, lease_expires_at, status_code, response_headers, response_body, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5::text::idempotency_state, 7, $6, now() + interval '1 hour', $7, $8::jsonb,
				CASE WHEN $5 = 'completed' THEN '\x00'::bytea END,
				now() - interval '10 minutes', now() - interval '10 minutes' + $9::bigint * interval '1 microsecond')`,
			ref.Tenant, ref.Operation, ref.KeyHash[:], fp, state, tok.Owner, status, hdrs, retention.Microseconds())
		if err != nil {
			t.Fatalf("insert a legacy row: %v", err)
		}
		// Once the table has the column, with its digest: every version
		// since 003 writes it, and 006 leaves none without.
		d := ref.Digest()
		if _, err := f.pool.Exec(ctx, `DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'idempotency_requests'::regclass
			AND attname = 'operation_digest') THEN UPDATE idempotency_requests SET operation_digest = '\x`+hex.EncodeToString(d[:])+`'::bytea
			WHERE key_hash = '\x`+hex.EncodeToString(ref.KeyHash[:])+`'::bytea; END IF; END $$`); err != nil {
			t.Fatal(err)
		}
		return ref, tok
	}
	doneRef, _ := insert("completed", legacyJSON, time.Hour)
	openRef, openTok := insert("processing", nil, 2*time.Hour)

	check := func(what string) {
		t.Helper()
		rec, err := f.s.Get(ctx, doneRef)
		if err != nil {
			t.Fatalf("%s: Get: %v", what, err)
		}
		if rec.Result == nil || !maps.EqualFunc(rec.Result.Headers, legacy, slices.Equal[[]string]) {
			t.Fatalf("%s: converted headers %q; want %q", what, rec.Result.Headers, legacy)
		}
		var bin []byte
		var retUs int64
		if err := f.pool.QueryRow(ctx, `SELECT response_headers_bin, retention_us FROM idempotency_requests
			WHERE key_hash = $1`, doneRef.KeyHash[:]).Scan(&bin, &retUs); err != nil {
			t.Fatal(err)
		}
		if want := headers.Encode(legacy); !bytes.Equal(bin, want) {
			t.Fatalf("%s: SQL conversion %q; the Go encoding is %q", what, bin, want)
		}
		if retUs != time.Hour.Microseconds() {
			t.Fatalf("%s: retention_us %d; want an hour", what, retUs)
		}
	}
	if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
		t.Fatalf("Migrate over 001: %v", err)
	}
	check("after Migrate")
	if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	check("after Migrate again")

	// The converted retention governs a late finish: two hours from now.
	if err := f.s.Complete(ctx, nil, openRef, openTok, result); err != nil {
		t.Fatal(err)
	}
	if rec, _ := f.s.Get(ctx, openRef); rec.ExpiresIn < 2*time.Hour-time.Minute || rec.ExpiresIn > 2*time.Hour {
		t.Fatalf("legacy record finished now: ExpiresIn %v; want its two-hour retention from now", rec.ExpiresIn)
	}
	// A row the previous version writes after the migration.
	lateRef, lateTok := insert("processing", nil, 3*time.Hour)
	if err := f.s.Complete(ctx, nil, lateRef, lateTok, result); err != nil {
		t.Fatal(err)
	}
	if rec, _ := f.s.Get(ctx, lateRef); rec.ExpiresIn < 3*time.Hour-time.Minute || rec.ExpiresIn > 3*time.Hour {
		t.Fatalf("row without retention_us finished now: ExpiresIn %v; want expires_at - created_at (3h) from now", rec.ExpiresIn)
	}
	jsonRef, _ := insert("completed", legacyJSON, time.Hour)
	if rec, err := f.s.Get(ctx, jsonRef); err != nil || !maps.EqualFunc(rec.Result.Headers, legacy, slices.Equal[[]string]) {
		t.Fatalf("row without response_headers_bin: %+v, %v; want its jsonb headers", rec.Result, err)
	}

	// Down, then up again.
	down2, err := fs.ReadFile(postgres.Migrations(), "002_retention_and_binary_headers.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, string(down2)); err != nil {
		t.Fatalf("002 down: %v", err)
	}
	var cols int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency_requests'::regclass
		AND attname IN ('retention_us', 'response_headers_bin') AND NOT attisdropped`).Scan(&cols); err != nil || cols != 0 {
		t.Fatalf("after 002 down: %d new columns left, %v", cols, err)
	}
	if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
		t.Fatalf("Migrate after 002 down: %v", err)
	}
	check("after down and up")
}

// A replay answered by the database reads: it takes no row lock and writes
// nothing, so a replay storm during an incident (Redis off or lost) costs
// one indexed read per duplicate and never queues behind a lock. The
// control: an in-progress record is still claimed through the locking
// upsert, which waits for the lock and then reports the lock timeout.
func TestStore_ReplayTakesNoLock(t *testing.T) {
	opts := []postgres.Option{postgres.WithLockTimeout(200 * time.Millisecond)}
	f := newFixture(t, fixtureOpts{opts: opts})
	ctx := ctxOf(t)
	finished, running := scope(), scope()
	ref, _ := f.s.Ref(finished)
	tok := acquire(t, f.s, claimParams(finished, time.Hour))
	if err := f.s.Complete(ctx, nil, ref, tok, result); err != nil {
		t.Fatal(err)
	}
	acquire(t, f.s, claimParams(running, time.Hour))

	xmax := func() string {
		var x string
		if err := f.pool.QueryRow(ctx, `SELECT xmax::text FROM idempotency_requests WHERE key_hash = $1`, ref.KeyHash[:]).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	before := xmax()
	res, err := f.s.Claim(ctx, nil, claimParams(finished, time.Hour))
	if err != nil || res.Acquired || res.Record == nil || res.Record.State != durable.Completed ||
		!bytes.Equal(res.Record.Result.Body, result.Body) {
		t.Fatalf("replay Claim = %+v, %v; want the completed record", res, err)
	}
	if after := xmax(); after != before {
		t.Fatalf("xmax %s -> %s: the replay locked or wrote the row", before, after)
	}

	// Another session holds both rows locked, as a long transaction would.
	locker, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(context.Background()) //nolint:errcheck
	if _, err := locker.Exec(ctx, `SELECT 1 FROM idempotency_requests FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		res, err := f.s.Claim(ctx, nil, claimParams(finished, time.Hour))
		if err != nil || res.Record == nil || res.Record.State != durable.Completed {
			t.Fatalf("replay under a row lock = %+v, %v; want the completed record at once", res, err)
		}
	}
	if _, err := f.s.Claim(ctx, nil, claimParams(running, time.Hour)); !errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("claim of a locked in-progress record = %v; want the lock timeout (ErrUnavailable)", err)
	}
}
