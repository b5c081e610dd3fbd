package claim_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Redis modes every outcome is tested in.
const (
	withRedis   = "WithRedis"
	withoutRed  = "WithoutRedis"
	breakerOpen = "BreakerOpen"
)

var modes = []string{withRedis, withoutRed, breakerOpen}

// isSettingsRead tells the Claimer's one-time read of the store's settings
// (the statement that starts as postgres.CheckDurability's does) apart: it
// belongs to no operation.
func isSettingsRead(sql string) bool {
	return strings.HasPrefix(sql, "select current_setting('synchronous_commit'")
}

type env struct {
	t      *testing.T
	schema testenv.Schema
	pool   *pgxpool.Pool
	store  storeapi.Store[pgx.Tx]
	rdb    *redis.Client // nil without Redis
	prefix string
	c      *claim.Claimer[pgx.Tx]
	stmts  *testenv.StatementCounter // leaves out the settings read
}

// setup returns a Claimer on a fresh schema, in the given Redis mode.
func setup(t *testing.T, mode string, opts ...claim.Option) *env {
	t.Helper()
	s := testenv.Postgres(t)
	cfg := poolConfig(t, s.URL)
	ctr := &testenv.StatementCounter{Skip: isSettingsRead}
	cfg.ConnConfig.Tracer = ctr
	pool, st := migratedStore(t, cfg, s.Name)
	e := &env{t: t, schema: s, pool: pool, store: st.(storeapi.Store[pgx.Tx]), stmts: ctr}
	switch mode {
	case withRedis:
		e.rdb, e.prefix = testenv.Redis(t)
		opts = append([]claim.Option{claim.WithRedis(e.rdb, lua.Options{Prefix: e.prefix, Timeout: time.Second})}, opts...)
	case breakerOpen:
		// Every Redis call fails at once: the breaker opens after the
		// first failure.
		opts = append([]claim.Option{claim.WithRedis(deadRedis(t), lua.Options{Prefix: "dead", BreakerFailures: 1, BreakerCoolDown: time.Hour})}, opts...)
	}
	c, err := claim.New[pgx.Tx](st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	ctr.Reset()
	return e
}

// poolConfig parses the connection string url.
func poolConfig(tb testing.TB, url string) *pgxpool.Config {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// migratedStore returns a store on schema, migrated, over a pool of its own
// made from cfg (closed when tb ends).
func migratedStore(tb testing.TB, cfg *pgxpool.Config, schema string) (*pgxpool.Pool, durable.Store[pgx.Tx]) {
	tb.Helper()
	ctx := tb.Context()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if err := postgres.Migrate(ctx, pool, postgres.WithSchema(schema)); err != nil {
		tb.Fatal(err)
	}
	st, err := postgres.New(pool, postgres.WithSchema(schema))
	if err != nil {
		tb.Fatal(err)
	}
	return pool, st
}

// deadRedis returns a client of a Redis nothing listens for (port 1): every
// call fails at once.
func deadRedis(t *testing.T) *redis.Client {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	return dead
}

// downStore returns a store on the env's schema whose pool points at a port
// nothing listens on.
func (e *env) downStore() durable.Store[pgx.Tx] {
	e.t.Helper()
	pool, err := pgxpool.New(e.t.Context(), "postgres://postgres@127.0.0.1:1/test?connect_timeout=1")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	down, err := postgres.New(pool, postgres.WithSchema(e.schema.Name))
	if err != nil {
		e.t.Fatal(err)
	}
	return down
}

// newClaimer returns a Claimer over st, with the env's Redis in front as
// setup puts it (none without Redis), and opts.
func (e *env) newClaimer(st durable.Store[pgx.Tx], opts ...claim.Option) *claim.Claimer[pgx.Tx] {
	e.t.Helper()
	if e.rdb != nil {
		opts = append([]claim.Option{claim.WithRedis(e.rdb, lua.Options{Prefix: e.prefix, Timeout: time.Second})}, opts...)
	}
	c, err := claim.New[pgx.Tx](st, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func req(key, fp string) claim.Request {
	return claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: key}, Fingerprint: fp}
}

func (e *env) ref(r claim.Request) durable.Ref {
	e.t.Helper()
	ref, err := e.store.Ref(r.Scope)
	if err != nil {
		e.t.Fatal(err)
	}
	return ref
}

// expireLease ends the current lease of r's record now, by the database's
// clock, as if its worker had paused past it.
func (e *env) expireLease(r claim.Request) {
	e.t.Helper()
	ref := e.ref(r)
	_, err := e.pool.Exec(e.t.Context(),
		`UPDATE `+e.schema.Name+`.idempotency_requests SET lease_expires_at = clock_timestamp() - interval '1 second'
		 WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3`, ref.Tenant, ref.Operation, ref.KeyHash[:])
	if err != nil {
		e.t.Fatal(err)
	}
	if e.rdb != nil {
		e.rdb.Del(e.t.Context(), fastpath.KeysFor(e.prefix, ref).Record)
	}
}

func (e *env) flushRedis() {
	e.t.Helper()
	if e.rdb == nil {
		return
	}
	ctx := e.t.Context()
	iter := e.rdb.Scan(ctx, 0, e.prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		e.rdb.Del(ctx, iter.Val())
	}
	if err := iter.Err(); err != nil {
		e.t.Fatal(err)
	}
}

func result(body string) durable.Result {
	return durable.Result{StatusCode: 201, Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(body), Version: 1}
}

func mustClaim(t *testing.T, c *claim.Claimer[pgx.Tx], r claim.Request, want claim.Kind) claim.Outcome {
	t.Helper()
	out, err := c.Claim(t.Context(), r)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if out.Kind != want {
		t.Fatalf("Claim kind = %v, want %v", out.Kind, want)
	}
	return out
}
