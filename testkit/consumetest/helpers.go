package consumetest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Actions records what a consumer did with each delivery. Safe for
// concurrent use.
type Actions struct {
	mu  sync.Mutex
	got []consume.Action
	err []error
}

// Add records one delivery's action and error.
func (a *Actions) Add(x consume.Action, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, x)
	a.err = append(a.err, err)
}

// List returns the actions and errors recorded, in order.
func (a *Actions) List() ([]consume.Action, []error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]consume.Action(nil), a.got...), append([]error(nil), a.err...)
}

// LastIs reports whether the last action recorded is x.
func (a *Actions) LastIs(x consume.Action) bool {
	got, _ := a.List()
	return len(got) > 0 && got[len(got)-1] == x
}

// WaitUntil polls ok until it holds, failing t after within.
func WaitUntil(t testing.TB, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// KeepAlives counts the goroutines renewing a lease.
func KeepAlives() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "claim.(*Lease).KeepAlive")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// Log is a log sink for slog that tests read while loggers write.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns what was written.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Schema returns a schema of the test's own (testenv.Postgres), migrated,
// with the table of the Do tests' effects: effects (op_id, msg).
func Schema(t testing.TB) testenv.Schema {
	t.Helper()
	ctx := context.Background()
	schema := testenv.Postgres(t)
	if err := postgres.Migrate(ctx, schema.Pool, postgres.WithSchema(schema.Name)); err != nil {
		t.Fatal(err)
	}
	if _, err := schema.Pool.Exec(ctx, `CREATE TABLE effects (op_id text NOT NULL, msg text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return schema
}

// Effects counts the rows of schema's effects table and their distinct
// messages.
func Effects(t testing.TB, schema testenv.Schema) (rows, distinct int) {
	t.Helper()
	if err := schema.Pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT msg) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// State returns the state of the only record in schema ("" before it
// exists).
func State(t testing.TB, schema testenv.Schema) string {
	t.Helper()
	var s string
	err := schema.Pool.QueryRow(context.Background(), `SELECT state::text FROM idempotency_requests`).Scan(&s)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return s
}

// Proxied returns a pool on schema through a pgproxy.Cutter the test can
// take down (the database unreachable). t's cleanups close both.
func Proxied(t testing.TB, schema testenv.Schema) (*pgproxy.Cutter, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(schema.URL)
	if err != nil {
		t.Fatal(err)
	}
	px, err := pgproxy.New("tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = px.Port()
	cfg.ConnConfig.ConnectTimeout = time.Second
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return px, p
}

// Claimer returns a Claimer with lease on schema, through pool (nil: the
// schema's own), with rdb in front under prefix when rdb is not nil.
func Claimer(t testing.TB, schema testenv.Schema, pool *pgxpool.Pool, rdb redis.Scripter, prefix string, lease time.Duration) *claim.Claimer[pgx.Tx] {
	t.Helper()
	if pool == nil {
		pool = schema.Pool
	}
	st, err := postgres.New(pool, postgres.WithSchema(schema.Name))
	if err != nil {
		t.Fatal(err)
	}
	opts := []claim.Option{claim.WithLease(lease), claim.WithRetention(time.Hour)}
	if rdb != nil {
		opts = append(opts, claim.WithRedis(rdb, lua.Options{Prefix: prefix, Timeout: time.Second}))
	}
	c, err := claim.New(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// FenceHeld fences every record of schema still held (processing, with
// an owner), then waits half a lease, so that a renewal left running (a
// broken settlement's, whose lease nobody stops) comes back fenced and
// ends: register it with t.Cleanup after the Claimer's pool, so it runs
// before the pool closes.
func FenceHeld(t testing.TB, schema testenv.Schema, lease time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := schema.Pool.Exec(ctx, `UPDATE idempotency_requests SET generation = generation + 1, owner_token = gen_random_uuid()
		WHERE state = 'processing' AND owner_token IS NOT NULL`)
	if err != nil {
		t.Logf("consumetest: fence the records still held: %v", err)
	}
	time.Sleep(lease / 2)
}
