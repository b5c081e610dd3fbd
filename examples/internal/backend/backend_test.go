package backend_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestMain(m *testing.M) {
	// After a failed dial go-redis probes the server from a goroutine of
	// its own, which sees the client closed at its next probe, up to a
	// second after Close (the tests with Redis at a closed port).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

func TestOpen_NothingNamedIsEmbedded(t *testing.T) {
	t.Parallel()
	b, err := backend.Open(t.Context(), backend.Config{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if !b.Embedded() || b.Postgres != nil || b.Pool != nil || b.Redis == nil {
		t.Fatalf("backend = %+v; want SQLite and an in-process Redis", b)
	}
	if err := b.Redis.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("in-process Redis: %v", err)
	}
	desc := strings.Join(b.Describe(), "\n")
	for _, want := range []string{"SQLite ", "embedded default", "removed at exit", "in-process miniredis"} {
		if !strings.Contains(desc, want) {
			t.Errorf("Describe lacks %q:\n%s", want, desc)
		}
	}
	dir := filepath.Dir(strings.Fields(strings.TrimPrefix(b.Describe()[0], "durable store: SQLite "))[0])
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("temporary folder: %v", err)
	}
	b.Close()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary folder %s left after Close (stat: %v)", dir, err)
	}
	b.Close() // twice is fine
}

func TestOpen_DataDirIsKept(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	b, err := backend.Open(t.Context(), backend.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := os.Stat(filepath.Join(dir, "oncekey.db")); err != nil {
		t.Errorf("database in -data folder: %v", err)
	}
}

// A named PostgreSQL that does not answer is an error that names the host,
// never the password of its URL; nothing falls back to the embedded
// default.
func TestOpen_UnreachablePostgresFails(t *testing.T) {
	t.Parallel()
	b, err := backend.Open(t.Context(), backend.Config{DatabaseURL: "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=2"})
	if !errors.Is(err, backend.ErrUnreachable) || b != nil {
		t.Fatalf("Open = %v, %v; want ErrUnreachable", b, err)
	}
	if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("error %q should name the host and hide the password", err)
	}
	if _, err := backend.Open(t.Context(), backend.Config{DatabaseURL: "postgres://%zz"}); !errors.Is(err, backend.ErrConfig) {
		t.Errorf("bad URL: %v, want ErrConfig", err)
	}
}

// closedPort returns a local address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// A named Redis that does not answer (a closed local port) is no error:
// Open warns once that the program runs on the durable store alone, never
// with the URL's password, says so in Describe, and claims work: executed
// once, then replayed, the durable store arbitrating.
func TestOpen_UnreachableRedisRunsOnTheDurableStore(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) backend.Config{
		"SQLite": func(t *testing.T) backend.Config { return backend.Config{DataDir: t.TempDir()} },
		"PostgreSQL": func(t *testing.T) backend.Config {
			return backend.Config{DatabaseURL: testenv.Postgres(t).URL}
		},
	}
	for store, config := range stores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			cfg := config(t)
			addr := closedPort(t)
			cfg.RedisURL = "redis://:s3cret@" + addr + "/0"
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			b, err := backend.Open(t.Context(), cfg)
			if err != nil {
				t.Fatalf("Open with an unreachable Redis: %v; want it to run on %s alone", err, store)
			}
			defer b.Close()
			if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "running on "+store+" alone") ||
				!strings.Contains(logs.String(), addr) || strings.Contains(logs.String(), "s3cret") {
				t.Errorf("log (want one WARN naming the address, not the password):\n%s", logs.String())
			}
			if desc := strings.Join(b.Describe(), "\n"); !strings.Contains(desc, "redis: "+addr+"/0 unreachable") || !strings.Contains(desc, "running on "+store+" alone") {
				t.Errorf("Describe:\n%s", desc)
			}
			req := claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /t", Key: "k-" + store + "-" + addr}, Fingerprint: "v1:x"}
			var outs []claim.Outcome
			if b.Postgres != nil {
				outs = doTwice(t, b.Postgres, b.ClaimOptions(), req)
			} else {
				outs = doTwice(t, b.SQLite, b.ClaimOptions(), req)
			}
			if outs[0].Kind != claim.Executed || outs[1].Kind != claim.Replayed || outs[1].Result == nil || string(outs[1].Result.Body) != "once" {
				t.Fatalf("outcomes %v, %v; want executed, then replayed", outs[0].Kind, outs[1].Kind)
			}
		})
	}
}

// doTwice runs one request twice through a Claimer on st with opts.
func doTwice[TTx any](t *testing.T, st durable.Store[TTx], opts []claim.Option, req claim.Request) []claim.Outcome {
	t.Helper()
	c, err := claim.New(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var outs []claim.Outcome
	for range 2 {
		out, err := c.Do(t.Context(), req, func(context.Context, TTx, claim.Op) (durable.Result, error) {
			return durable.Result{StatusCode: 201, Body: []byte("once")}, nil
		})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		outs = append(outs, out)
	}
	return outs
}

func TestOpen_NamedServers(t *testing.T) {
	t.Parallel()
	s := testenv.Postgres(t)
	_, prefix := testenv.Redis(t)
	b, err := backend.Open(t.Context(), backend.Config{DatabaseURL: s.URL, RedisURL: testenv.RedisURL(t), RedisPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Embedded() || b.Postgres == nil || b.Pool == nil {
		t.Fatalf("backend = %+v; want PostgreSQL", b)
	}
	var n int
	if err := b.Pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_requests`).Scan(&n); err != nil {
		t.Fatalf("the schema was not migrated: %v", err)
	}
	desc := strings.Join(b.Describe(), "\n")
	if !strings.Contains(desc, "PostgreSQL at ") || !strings.Contains(desc, "named by -redis or REDIS_URL") {
		t.Errorf("Describe:\n%s", desc)
	}
}
