//go:build unix

package pgbouncer_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/testkit/pgbouncer"
)

// connect opens a connection through b to its target's database, without
// named prepared statements.
func connect(t *testing.T, b *pgbouncer.Bouncer) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, b.PoolConfig(t, b.Database(), pgx.QueryExecModeExec).ConnConfig)
	if err != nil {
		t.Fatalf("connect through pgbouncer: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func backendPID(t *testing.T, c *pgx.Conn) uint32 {
	t.Helper()
	var pid uint32
	if err := c.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestTransactionPooling checks that the bouncer pools by transaction: a
// server session another client's transaction holds is not this client's,
// and a client's next transaction may run on the session another client
// used last.
func TestTransactionPooling(t *testing.T) {
	b := pgbouncer.Start(t, pgbouncer.Options{PoolSize: 2})
	a := connect(t, b)
	other := connect(t, b)
	first := backendPID(t, a)
	tx, err := other.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var held uint32
	if err := tx.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != first {
		t.Fatalf("another client's transaction runs on server session %d, not on %d, the one this client's last transaction released: not transaction pooling (or not LIFO)", held, first)
	}
	if again := backendPID(t, a); again == first {
		t.Fatalf("the client still runs on %d while another client's transaction holds it", again)
	}
	// The client's own PID (from BackendKeyData) is PgBouncer's, not a server's.
	if a.PgConn().PID() == first {
		t.Fatalf("BackendKeyData carries the server's pid %d", first)
	}
}

// TestAdminRestartClose checks the admin console, Restart on the same port,
// and that Close removes the directory.
func TestAdminRestartClose(t *testing.T) {
	b, err := pgbouncer.New(pgbouncer.Options{})
	if err != nil {
		if os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	dir := b.Dir()
	defer b.Close()
	ctx := t.Context()
	rows, err := b.Admin(ctx, "SHOW CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	mode := ""
	for _, r := range rows {
		if len(r) > 1 && r[0] == "pool_mode" {
			mode = r[1]
		}
	}
	if mode != "transaction" {
		t.Fatalf("pool_mode = %q, want transaction", mode)
	}
	c := connect(t, b)
	before := backendPID(t, c)
	if _, err := b.Admin(ctx, "KILL "+b.Database()); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err == nil {
		t.Fatal("a client connection survived KILL")
	}
	port := b.Port()
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	if b.Port() != port {
		t.Fatalf("port %d after restart, want %d", b.Port(), port)
	}
	c2 := connect(t, b)
	if after := backendPID(t, c2); after == before {
		t.Fatalf("server session %d survived KILL and restart", after)
	}
	b.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("Close left %s (%v)", dir, err)
	}
}
