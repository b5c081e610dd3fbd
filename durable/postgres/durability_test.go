package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// poolWith opens a pool on url whose sessions carry params.
func poolWith(t *testing.T, url string, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// statsDurability migrates a store on pool and returns its Stats.Durability.
func statsDurability(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	if err := postgres.Migrate(t.Context(), pool, postgres.WithSchema(schema)); err != nil {
		t.Fatal(err)
	}
	s, err := postgres.New(pool, postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st.Durability
}

// TestCheckDurability_DefaultServerIsDurable: the test server runs with
// synchronous_commit=on, fsync=on, full_page_writes=on and no standby.
func TestCheckDurability_DefaultServerIsDurable(t *testing.T) {
	t.Parallel()
	sch := testenv.Postgres(t)
	if err := postgres.CheckDurability(t.Context(), sch.Pool); err != nil {
		t.Fatalf("CheckDurability on the default server: %v", err)
	}
	if d := statsDurability(t, sch.Pool, sch.Name); d != "" {
		t.Fatalf("Stats.Durability = %q, want empty", d)
	}
	if err := postgres.CheckDurability(t.Context(), nil); !errors.Is(err, postgres.ErrConfig) {
		t.Fatalf("nil pool: %v, want ErrConfig", err)
	}
}

// TestCheckDurability_SessionSynchronousCommitOff: the pool's own sessions
// run with synchronous_commit=off (set in the connection's parameters):
// the check reads what those sessions see and names the setting to change.
func TestCheckDurability_SessionSynchronousCommitOff(t *testing.T) {
	t.Parallel()
	sch := testenv.Postgres(t)
	pool := poolWith(t, sch.URL, map[string]string{"synchronous_commit": "off"})
	err := postgres.CheckDurability(t.Context(), pool)
	if !errors.Is(err, postgres.ErrNotDurable) {
		t.Fatalf("CheckDurability = %v, want ErrNotDurable", err)
	}
	if !strings.Contains(err.Error(), "set synchronous_commit = on") {
		t.Fatalf("the error does not name the setting to change: %v", err)
	}
	if d := statsDurability(t, pool, sch.Name); !strings.Contains(d, "synchronous_commit=off") {
		t.Fatalf("Stats.Durability = %q, want synchronous_commit=off reported", d)
	}
}

// TestCheckDurability_DatabaseSetting: a throwaway database whose default
// is synchronous_commit=off (ALTER DATABASE ... SET), the way an operator
// would configure it: every new session of the pool inherits it.
func TestCheckDurability_DatabaseSetting(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	base := testenv.DatabaseURL(t)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", "DATABASE_URL", err)
	}
	defer admin.Close(context.Background())
	name := testenv.Name("d_")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+name+" SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	c2, err := pgxpool.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	c2.ConnConfig.Database = name
	p2, err := pgxpool.NewWithConfig(ctx, c2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p2.Close)
	err = postgres.CheckDurability(ctx, p2)
	if !errors.Is(err, postgres.ErrNotDurable) || !strings.Contains(err.Error(), "synchronous_commit=off") {
		t.Fatalf("CheckDurability on a database with synchronous_commit=off = %v, want ErrNotDurable naming it", err)
	}
	// A session that sets it back on (the connection string wins over the
	// database default) is durable: the check reads the session, not the file.
	c3 := c2.Copy()
	c3.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	p3, err := pgxpool.NewWithConfig(ctx, c3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p3.Close)
	if err := postgres.CheckDurability(ctx, p3); err != nil {
		t.Fatalf("CheckDurability with synchronous_commit=on in the session: %v", err)
	}
}

// TestCheckDurability_Unreachable: a database that cannot be reached is
// unavailable, not durable and not ErrNotDurable.
func TestCheckDurability_Unreachable(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/test?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	err = postgres.CheckDurability(t.Context(), pool)
	if !errors.Is(err, durable.ErrUnavailable) || errors.Is(err, postgres.ErrNotDurable) {
		t.Fatalf("CheckDurability on a closed port = %v, want ErrUnavailable", err)
	}
}
