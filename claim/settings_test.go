package claim_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// The warnings of the Claimer's one-time check of the store's settings.
const (
	warnDurability = "can lose acknowledged commits"
	warnTimeouts   = "not configured with postgres.ConfigurePool"
)

// settingsStmts counts the Claimer's settings reads (isSettingsRead).
type settingsStmts struct{ n atomic.Int64 }

func (c *settingsStmts) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if isSettingsRead(d.SQL) {
		c.n.Add(1)
	}
	return ctx
}
func (c *settingsStmts) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// settingsEnv is a Claimer logging to buf, on a pool of its own made from
// a connection string with query (appended to the schema's URL), set up by
// configure (nil: left as parsed).
type settingsEnv struct {
	c     *claim.Claimer[pgx.Tx]
	pool  *pgxpool.Pool
	buf   *syncBuf
	reads *settingsStmts
}

func newSettingsEnv(t *testing.T, query string, configure func(*pgxpool.Config) error, opts ...claim.Option) *settingsEnv {
	t.Helper()
	sch := testenv.Postgres(t)
	cfg := poolConfig(t, sch.URL+query)
	if configure != nil {
		if err := configure(cfg); err != nil {
			t.Fatal(err)
		}
	}
	reads := &settingsStmts{}
	cfg.ConnConfig.Tracer = reads
	pool, st := migratedStore(t, cfg, sch.Name)
	buf := &syncBuf{}
	c, err := claim.New[pgx.Tx](st, append([]claim.Option{claim.WithLogger(slog.New(slog.NewTextHandler(buf, nil)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &settingsEnv{c: c, pool: pool, buf: buf, reads: reads}
}

func configurePool(cfg *pgxpool.Config) error { return postgres.ConfigurePool(cfg) }

// syncCommitOff is the connection string's part that makes every session
// of the pool run with synchronous_commit=off.
const syncCommitOff = "&options=-csynchronous_commit%3Doff"

// waitFor waits up to 10s for want to be logged (the check runs beside the
// claim) and returns how many times it was.
func (e *settingsEnv) waitFor(t *testing.T, want string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(e.buf.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%q not logged within 10s:\n%s", want, e.buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return strings.Count(e.buf.String(), want)
}

func writeNothing(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
	return result("ok"), nil
}

// TestClaimer_DurabilityWarnedOnEveryPath: synchronous_commit=off (set in
// the connection string) is logged once by whichever path claims first,
// not only by Claim: Do, DoTx and the adapters' claim in a transaction
// (claimriver's) each log it on their own.
func TestClaimer_DurabilityWarnedOnEveryPath(t *testing.T) {
	t.Parallel()
	for name, first := range map[string]func(t *testing.T, e *settingsEnv){
		"Claim": func(t *testing.T, e *settingsEnv) {
			mustClaim(t, e.c, req("k", "v1:a"), claim.Acquired)
		},
		"Do": func(t *testing.T, e *settingsEnv) {
			if out, err := e.c.Do(t.Context(), req("k", "v1:a"), writeNothing); err != nil || out.Kind != claim.Executed {
				t.Fatalf("Do = %v, %v; want Executed", out.Kind, err)
			}
		},
		"DoTx": func(t *testing.T, e *settingsEnv) {
			tx, err := e.pool.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			out, finish, err := e.c.DoTx(t.Context(), tx, req("k", "v1:a"), writeNothing)
			if err != nil || out.Kind != claim.Executed {
				_ = tx.Rollback(t.Context())
				t.Fatalf("DoTx = %v, %v; want Executed", out.Kind, err)
			}
			finish(t.Context(), tx.Commit(t.Context()))
		},
		"ClaimInTx": func(t *testing.T, e *settingsEnv) {
			err := e.c.Driver().InTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
				out, _, err := e.c.Driver().ClaimTx(ctx, tx, req("k", "v1:a"))
				if err == nil && out.Kind != claim.Acquired {
					t.Errorf("ClaimTx = %v; want Acquired", out.Kind)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newSettingsEnv(t, syncCommitOff, configurePool)
			first(t, e)
			if n := e.waitFor(t, warnDurability); n != 1 {
				t.Fatalf("warning logged %d times, want once:\n%s", n, e.buf.String())
			}
			if !strings.Contains(e.buf.String(), "set synchronous_commit = on") {
				t.Fatalf("the warning does not name the setting to change:\n%s", e.buf.String())
			}
			if strings.Contains(e.buf.String(), warnTimeouts) {
				t.Fatalf("a pool configured with ConfigurePool was reported as not:\n%s", e.buf.String())
			}
		})
	}
}

// TestClaimer_DurabilityWarnedOncePerClaimer: many calls on every path,
// concurrent and after the warning, read the settings once and log the
// warning once.
func TestClaimer_DurabilityWarnedOncePerClaimer(t *testing.T) {
	t.Parallel()
	e := newSettingsEnv(t, syncCommitOff, configurePool)
	calls := func(prefix string) {
		done := make(chan error, 10)
		for i := range 10 {
			go func() {
				r := req(prefix+string(rune('a'+i)), "v1:a")
				_, err := e.c.Do(t.Context(), r, writeNothing)
				done <- err
			}()
		}
		for range 10 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
		mustClaim(t, e.c, req(prefix+"-claim", "v1:a"), claim.Acquired)
	}
	calls("first-")
	e.waitFor(t, warnDurability)
	calls("then-")
	time.Sleep(200 * time.Millisecond) // a second read, if any, would have logged by now
	if n := strings.Count(e.buf.String(), warnDurability); n != 1 {
		t.Fatalf("warning logged %d times over 22 calls, want once:\n%s", n, e.buf.String())
	}
	if n := e.reads.n.Load(); n != 1 {
		t.Fatalf("settings read %d times, want once", n)
	}
}

// TestClaimer_PoolNotConfiguredWarnedOnce: a pool not configured with
// postgres.ConfigurePool (its sessions have no lock_timeout) is logged once
// on first use; one configured with it, or whose connection string sets
// both timeouts, is not.
func TestClaimer_PoolNotConfiguredWarnedOnce(t *testing.T) {
	t.Parallel()
	t.Run("NotConfigured", func(t *testing.T) {
		t.Parallel()
		e := newSettingsEnv(t, "", nil)
		for i := range 3 {
			if _, err := e.c.Do(t.Context(), req("k"+string(rune('0'+i)), "v1:a"), writeNothing); err != nil {
				t.Fatal(err)
			}
		}
		if n := e.waitFor(t, warnTimeouts); n != 1 {
			t.Fatalf("warning logged %d times, want once:\n%s", n, e.buf.String())
		}
		for _, want := range []string{"level=WARN", "lock_timeout", "idle_in_transaction_session_timeout"} {
			if !strings.Contains(e.buf.String(), want) {
				t.Fatalf("the warning lacks %q:\n%s", want, e.buf.String())
			}
		}
		if strings.Contains(e.buf.String(), warnDurability) {
			t.Fatalf("a durable database was reported as not:\n%s", e.buf.String())
		}
	})
	for name, tc := range map[string]struct {
		query     string
		configure func(*pgxpool.Config) error
	}{
		"ConfigurePool":    {syncCommitOff, configurePool},
		"ConnectionString": {"&options=-clock_timeout%3D5s%20-cidle_in_transaction_session_timeout%3D15s%20-csynchronous_commit%3Doff", nil},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// synchronous_commit=off makes the check log something, so the
			// test knows it ran.
			e := newSettingsEnv(t, tc.query, tc.configure)
			mustClaim(t, e.c, req("k", "v1:a"), claim.Acquired)
			e.waitFor(t, warnDurability)
			if strings.Contains(e.buf.String(), warnTimeouts) {
				t.Fatalf("a pool whose sessions have both timeouts was reported:\n%s", e.buf.String())
			}
		})
	}
}

// TestClaimer_NoSettingsReadWithoutLoggerOrMeter: a Claimer with nowhere to
// report the check (no logger, no MeterProvider) does not send it, so its
// first claim sends exactly the claim's statements.
func TestClaimer_NoSettingsReadWithoutLoggerOrMeter(t *testing.T) {
	t.Parallel()
	sch := testenv.Postgres(t)
	cfg := poolConfig(t, sch.URL+syncCommitOff)
	reads := &settingsStmts{}
	cfg.ConnConfig.Tracer = reads
	_, st := migratedStore(t, cfg, sch.Name)
	c, err := claim.New[pgx.Tx](st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(t.Context(), req("k", "v1:a"), writeNothing); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, c, req("k2", "v1:a"), claim.Acquired)
	time.Sleep(100 * time.Millisecond)
	if n := reads.n.Load(); n != 0 {
		t.Fatalf("settings read %d times by a Claimer with no logger or meter, want 0", n)
	}
}

// TestClaimer_NotMigrated: a Claimer on a table that was never migrated
// answers every claim with postgres.ErrNotMigrated, which says what to run,
// and runs nothing.
func TestClaimer_NotMigrated(t *testing.T) {
	t.Parallel()
	sch := testenv.Postgres(t)
	st, err := postgres.New(sch.Pool, postgres.WithSchema(sch.Name))
	if err != nil {
		t.Fatal(err)
	}
	c, err := claim.New[pgx.Tx](st)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Claim(t.Context(), req("k", "v1:a"))
	if !errors.Is(err, postgres.ErrNotMigrated) || !strings.HasPrefix(err.Error(), "claim: durable/postgres: the table is not migrated: run `oncekey migrate up`") {
		t.Fatalf("Claim = %v, want ErrNotMigrated saying what to run", err)
	}
	_, err = c.Do(t.Context(), req("k", "v1:a"), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		t.Error("Do ran fn on a table that does not exist")
		return result("ran"), nil
	})
	if !errors.Is(err, postgres.ErrNotMigrated) {
		t.Fatalf("Do = %v, want ErrNotMigrated", err)
	}
}
