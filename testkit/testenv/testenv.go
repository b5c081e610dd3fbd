// Package testenv finds the Redis and PostgreSQL servers that oncekey's
// integration tests talk to, and isolates each test on them.
//
// Services are found in this order:
//
//  1. REDIS_URL / DATABASE_URL (NATS_URL, AMQP_URL), when set;
//  2. when a Docker daemon answers (DOCKER_HOST, else
//     /var/run/docker.sock) and ONCEKEY_CONTAINERS is not "off": a
//     container of this test binary's own, started on first use by the
//     oncekey-containers command (see [ContainersEnabled]), RabbitMQ
//     (AMQP_URL) too;
//  3. the local defaults: redis://127.0.0.1:6379/0 and
//     postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
//
// When the service found does not answer, the test fails if CI=true (CI must
// never pass by skipping) and is skipped with the reason otherwise. The
// package itself starts no container: testcontainers-go lives in the
// module github.com/oncekey/oncekey/testkit/containers, which this package
// runs as a command, so no container tooling enters the library's module
// graph.
//
// Each PostgreSQL test gets a fresh schema, dropped when the test ends; each
// Redis test gets its own key prefix, whose keys are deleted when it ends. So
// packages and tests run in parallel against the same servers.
//
// [StatementCounter] counts the statements a pool sends, for the tests
// that check round trips.
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Local defaults, used when no URL is set.
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
)

// CI reports whether the tests run in CI (CI=true), where a missing service
// fails instead of skipping.
func CI() bool { return os.Getenv("CI") == "true" }

// Unavailable fails the test under CI and skips it otherwise, with a message
// that names the service and how to provide it.
func Unavailable(t testing.TB, service, env string, err error) {
	t.Helper()
	msg := fmt.Sprintf("testenv: %s unavailable (%v); set %s or run the server at its local default", service, err, env)
	if CI() {
		t.Fatal(msg + " [CI=true: a missing service fails the test]")
	}
	t.Skip(msg)
}

// DatabaseURL returns the URL of the PostgreSQL server the tests use:
// DATABASE_URL, else this binary's container when Docker answers, else
// DefaultDatabaseURL. Whether the server answers is checked by Postgres,
// which fails or skips the test.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "DATABASE_URL", "postgres", DefaultDatabaseURL)
}

// RedisURL returns the URL of the Redis server the tests use: REDIS_URL,
// else this binary's container when Docker answers, else DefaultRedisURL.
// Whether the server answers is checked by Redis, which fails or skips the
// test.
func RedisURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "REDIS_URL", "redis", DefaultRedisURL)
}

// serviceURL resolves a service in the package's order: env, container,
// local default. A container that should have started and did not is
// logged on t, and the local default is tried.
func serviceURL(t testing.TB, env, service, def string) string {
	t.Helper()
	u, err := resolve(env, service, def)
	if err != nil {
		t.Logf("%v; trying the local default %s", err, def)
	}
	return u
}

// resolve is serviceURL without a test: the URL, and the container's error
// when one should have started and did not (the URL is then def).
func resolve(env, service, def string) (string, error) {
	if u := os.Getenv(env); u != "" {
		return u, nil
	}
	if service != "" {
		u, ok, err := fromContainer(service)
		if ok && err == nil {
			return u, nil
		}
		if ok {
			return def, err
		}
	}
	return def, nil
}

// Name returns a short random identifier usable in a schema name or a key
// prefix: lowercase letters and digits, starting with a letter.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Schema is a fresh PostgreSQL schema for one test.
type Schema struct {
	// Name is the schema's name.
	Name string
	// URL connects with search_path set to the schema.
	URL string
	// Pool is a pool on URL, closed when the test ends.
	Pool *pgxpool.Pool
}

// Postgres creates a fresh schema for the test, returns a pool whose
// search_path is that schema, and drops the schema (CASCADE) when the test
// ends.
func Postgres(t testing.TB) Schema {
	t.Helper()
	base := DatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		Unavailable(t, "PostgreSQL", "DATABASE_URL", err)
	}
	defer admin.Close(context.Background())
	name := Name("t_")
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("testenv: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("testenv: drop schema %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+name+" CASCADE"); err != nil {
			t.Logf("testenv: drop schema %s: %v", name, err)
		}
	})
	url := withParam(base, "search_path", name)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return Schema{Name: name, URL: url, Pool: pool}
}

func withParam(url, k, v string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + k + "=" + v
}

// RedisOptions returns the parsed options of the test Redis server.
func RedisOptions(t testing.TB) *redis.Options {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatalf("testenv: REDIS_URL: %v", err)
	}
	return opt
}

// Redis returns a client for the test Redis server and a key prefix unique to
// the test. Keys under the prefix are deleted and the client closed when the
// test ends.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	c := redis.NewClient(RedisOptions(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		Unavailable(t, "Redis", "REDIS_URL", err)
	}
	prefix := Name("t")
	t.Cleanup(func() {
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		for len(keys) > 0 {
			n := min(len(keys), 500)
			c.Del(ctx, keys[:n]...)
			keys = keys[n:]
		}
	})
	return c, prefix
}

// Example returns what a runnable Example function needs, which has no
// testing.T: a pool on a fresh schema, a Redis client and a key prefix of its
// own. cleanup drops the schema, deletes the prefix's keys and closes both.
// It panics when a service does not answer: an Example cannot skip.
func Example() (pool *pgxpool.Pool, rdb *redis.Client, prefix string, cleanup func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	base, cerr := resolve("DATABASE_URL", "postgres", DefaultDatabaseURL)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		panic(fmt.Sprintf("testenv: PostgreSQL unavailable (%v); set DATABASE_URL or run the server at its local default%s", err, also(cerr)))
	}
	defer admin.Close(context.Background())
	schema := Name("x_")
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(fmt.Sprintf("testenv: create schema: %v", err))
	}
	pool, err = pgxpool.New(ctx, withParam(base, "search_path", schema))
	if err != nil {
		panic(fmt.Sprintf("testenv: pool: %v", err))
	}
	rdb, prefix, redisCleanup := ExampleRedis()
	return pool, rdb, prefix, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool.Close()
		if c, err := pgx.Connect(ctx, base); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			_ = c.Close(ctx)
		}
		redisCleanup()
	}
}

// ExampleRedis is the Redis half of [Example]: a client and a key prefix of
// its own; cleanup deletes the prefix's keys and closes the client.
func ExampleRedis() (rdb *redis.Client, prefix string, cleanup func()) {
	u, cerr := resolve("REDIS_URL", "redis", DefaultRedisURL)
	opt, err := redis.ParseURL(u)
	if err != nil {
		panic(fmt.Sprintf("testenv: REDIS_URL: %v", err))
	}
	rdb = redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		panic(fmt.Sprintf("testenv: Redis unavailable (%v); set REDIS_URL or run the server at its local default%s", err, also(cerr)))
	}
	prefix = Name("x")
	return rdb, prefix, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		rdb.Close()
	}
}

// Local defaults of the message brokers, used when no URL is set.
const (
	DefaultNATSURL = "nats://127.0.0.1:4222"
	DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"
)

// NATSURL returns the URL of the NATS server (with JetStream) the tests use:
// NATS_URL, else this binary's container when Docker answers, else
// DefaultNATSURL. The caller dials it and calls
// Unavailable(t, "NATS", "NATS_URL", err) when it does not answer (this
// package holds no broker client).
func NATSURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "NATS_URL", "nats", DefaultNATSURL)
}

// AMQPURL returns the URL of the RabbitMQ server the tests use: AMQP_URL,
// else this binary's container when Docker answers, else DefaultAMQPURL.
// The caller dials it and calls Unavailable(t, "RabbitMQ", "AMQP_URL", err)
// when it does not answer.
func AMQPURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "AMQP_URL", "rabbitmq", DefaultAMQPURL)
}

// also formats a container's error after a message, or "".
func also(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}
