//go:build unix

package claim_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/pgbouncer"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// bouncedStore returns a migrated store on a fresh schema whose pool goes
// through b (PgBouncer in transaction pooling mode), set up as
// durable/postgres documents for it: a query exec mode without named
// prepared statements, no startup parameters (no ConfigurePool), the
// schema named with WithSchema. It also returns the pool and the schema.
func bouncedStore(t *testing.T, b *pgbouncer.Bouncer, mode pgx.QueryExecMode, configure bool) (durable.Store[pgx.Tx], *pgxpool.Pool, string) {
	t.Helper()
	sch := testenv.Postgres(t)
	cfg := b.PoolConfig(t, b.Database(), mode)
	opts := []postgres.Option{postgres.WithSchema(sch.Name)}
	if configure {
		if err := postgres.ConfigurePool(cfg, opts...); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if !configure {
		if err := postgres.Migrate(t.Context(), pool, opts...); err != nil {
			t.Fatalf("Migrate through PgBouncer: %v", err)
		}
	}
	st, err := postgres.New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return st, pool, sch.Name
}

// TestPgBouncer_ClaimFlows runs Claim, Complete and the replays, Do (claim
// first and WithWriteAtCommit) and concurrent Do on one key, through
// PgBouncer 1.18 in transaction pooling mode, with each query exec mode
// the durable/postgres documentation gives for it. The guarantees hold as
// on a direct connection: one execution, the stored result replayed.
func TestPgBouncer_ClaimFlows(t *testing.T) {
	t.Parallel()
	b := pgbouncer.Start(t, pgbouncer.Options{Target: testenv.DatabaseURL(t)})
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			st, pool, schema := bouncedStore(t, b, mode, false)
			if err := postgres.CheckDurability(ctx, pool); err != nil {
				t.Fatalf("CheckDurability through PgBouncer: %v", err)
			}
			rdb, prefix := testenv.Redis(t)
			withRedis, err := claim.New[pgx.Tx](st, claim.WithRedis(rdb, lua.Options{Prefix: prefix}))
			if err != nil {
				t.Fatal(err)
			}
			storeOnly, err := claim.New[pgx.Tx](st)
			if err != nil {
				t.Fatal(err)
			}
			atCommit, err := claim.New[pgx.Tx](st, claim.WithWriteAtCommit())
			if err != nil {
				t.Fatal(err)
			}

			t.Run("ClaimCompleteReplay", func(t *testing.T) {
				for name, c := range map[string]*claim.Claimer[pgx.Tx]{"redis": withRedis, "store": storeOnly} {
					req := claim.Request{
						Scope:       durable.Scope{Tenant: "t", Operation: "POST /deploys", Key: testenv.Name("k-" + name)},
						Fingerprint: "v1:fp",
					}
					out, err := c.Claim(ctx, req)
					if err != nil || out.Kind != claim.Acquired {
						t.Fatalf("%s: first claim = %v, %v; want acquired", name, out.Kind, err)
					}
					res := durable.Result{StatusCode: 202, Body: []byte("deployed"), Headers: map[string][]string{"Etag": {"\"1\""}}}
					if err := out.Lease.Complete(ctx, res); err != nil {
						t.Fatalf("%s: Complete: %v", name, err)
					}
					dup, err := c.Claim(ctx, req)
					if err != nil || dup.Kind != claim.Replayed || string(dup.Result.Body) != "deployed" || dup.Result.Headers["Etag"][0] != "\"1\"" {
						t.Fatalf("%s: retry = %+v, %v; want the stored result replayed", name, dup, err)
					}
					if _, err := c.Claim(ctx, claim.Request{Scope: req.Scope, Fingerprint: "v1:other"}); !errors.Is(err, claim.ErrMismatch) {
						t.Fatalf("%s: another payload = %v; want ErrMismatch", name, err)
					}
				}
			})

			t.Run("Do", func(t *testing.T) {
				table := schema + ".orders"
				if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY, n integer NOT NULL)`); err != nil {
					t.Fatal(err)
				}
				for name, c := range map[string]*claim.Claimer[pgx.Tx]{"redis": withRedis, "store": storeOnly, "at commit": atCommit} {
					req := claim.Request{
						Scope:       durable.Scope{Tenant: "t", Operation: "POST /orders", Key: testenv.Name("k-")},
						Fingerprint: "v1:fp",
					}
					var mu sync.Mutex
					runs := 0
					fn := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
						mu.Lock()
						runs++
						mu.Unlock()
						if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, n) VALUES ($1, $2)`, req.Scope.Key, 1); err != nil {
							return durable.Result{}, err
						}
						return durable.Result{StatusCode: 201, Body: []byte(`{"id":"` + req.Scope.Key + `"}`)}, nil
					}
					var wg sync.WaitGroup
					kinds := make(chan claim.Kind, 8)
					for range 8 {
						wg.Go(func() {
							out, err := c.Do(ctx, req, fn)
							if err != nil {
								t.Errorf("%s: Do: %v", name, err)
								return
							}
							kinds <- out.Kind
						})
					}
					wg.Wait()
					close(kinds)
					executed := 0
					for k := range kinds {
						switch k {
						case claim.Executed:
							executed++
						case claim.Replayed, claim.InProgress:
						default:
							t.Errorf("%s: concurrent Do = %v", name, k)
						}
					}
					out, err := c.Do(ctx, req, fn)
					if err != nil || out.Kind != claim.Replayed || out.Result.StatusCode != 201 {
						t.Fatalf("%s: Do after the others = %+v, %v; want replayed 201", name, out, err)
					}
					var rows int
					if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE id = $1`, req.Scope.Key).Scan(&rows); err != nil {
						t.Fatal(err)
					}
					mu.Lock()
					n := runs
					mu.Unlock()
					// fn may run more than once at commit (each run rolled
					// back but one); its write commits once.
					if executed != 1 || rows != 1 || (name != "at commit" && n != 1) {
						t.Fatalf("%s: %d executed, %d runs of fn, %d rows; want 1 executed, 1 row (1 run when claiming first)", name, executed, n, rows)
					}
				}
			})
		})
	}
}

// TestPgBouncer_MisconfiguredPoolFailsLoudly is the negative control: a
// pool set up the usual way for a direct connection (ConfigurePool's
// startup parameters) behind PgBouncer in transaction mode must not be
// taken for an unavailable database (retried for ever) but fail with an
// error matching postgres.ErrConfig that names PgBouncer and the fix.
func TestPgBouncer_MisconfiguredPoolFailsLoudly(t *testing.T) {
	t.Parallel()
	b := pgbouncer.Start(t, pgbouncer.Options{Target: testenv.DatabaseURL(t)})
	st, pool, _ := bouncedStore(t, b, pgx.QueryExecModeExec, true)
	c, err := claim.New[pgx.Tx](st)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Claim(t.Context(), claim.Request{Scope: durable.Scope{Tenant: "t", Operation: "POST /x", Key: testenv.Name("k-")}, Fingerprint: "v1:fp"})
	if !errors.Is(err, postgres.ErrConfig) || errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("Claim through PgBouncer with ConfigurePool's parameters = %v; want ErrConfig, not ErrUnavailable", err)
	}
	t.Logf("Claim: %v", err)
	if err := postgres.CheckDurability(t.Context(), pool); !errors.Is(err, postgres.ErrConfig) {
		t.Fatalf("CheckDurability = %v; want ErrConfig", err)
	}
}
