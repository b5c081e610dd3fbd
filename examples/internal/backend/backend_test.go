package backend_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
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

// A named server that does not answer is an error that names the host,
// never the password of its URL; nothing falls back to the embedded
// default.
func TestOpen_UnreachableNamedServersFail(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]backend.Config{
		"PostgreSQL": {DatabaseURL: "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=2"},
		"Redis":      {DataDir: t.TempDir(), RedisURL: "redis://:s3cret@127.0.0.1:1/0"},
	} {
		b, err := backend.Open(t.Context(), cfg)
		if !errors.Is(err, backend.ErrUnreachable) || b != nil {
			t.Errorf("%s: Open = %v, %v; want ErrUnreachable", name, b, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Errorf("%s: error %q should name the host and hide the password", name, err)
		}
	}
	if _, err := backend.Open(t.Context(), backend.Config{DatabaseURL: "postgres://%zz"}); !errors.Is(err, backend.ErrConfig) {
		t.Errorf("bad URL: %v, want ErrConfig", err)
	}
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
