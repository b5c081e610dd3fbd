package testenv_test

import (
	"bufio"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestPostgres_FreshSchemaPerTest(t *testing.T) {
	t.Parallel()
	a, b := testenv.Postgres(t), testenv.Postgres(t)
	if a.Name == b.Name {
		t.Fatalf("two calls shared schema %s", a.Name)
	}
	var sp string
	if err := a.Pool.QueryRow(t.Context(), "SHOW search_path").Scan(&sp); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sp, a.Name) {
		t.Fatalf("search_path %q does not name %s", sp, a.Name)
	}
	if _, err := a.Pool.Exec(t.Context(), "CREATE TABLE only_here (x int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.Pool.QueryRow(t.Context(), "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'only_here'", b.Name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("table leaked into another test's schema: %d, %v", n, err)
	}
}

func TestRedis_PrefixPerTest(t *testing.T) {
	t.Parallel()
	c, p1 := testenv.Redis(t)
	_, p2 := testenv.Redis(t)
	if p1 == p2 || !regexp.MustCompile(`^t[0-9a-f]{12}$`).MatchString(p1) {
		t.Fatalf("prefixes %q %q", p1, p2)
	}
	if err := c.Set(t.Context(), p1+":k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// Each service's URL is its variable when set, else (containers off) the
// local default.
func TestURLs_EnvThenLocalDefault(t *testing.T) {
	t.Setenv("ONCEKEY_CONTAINERS", "off")
	for _, c := range []struct {
		env      string
		url      func(testing.TB) string
		def, set string
	}{
		{"DATABASE_URL", testenv.DatabaseURL, testenv.DefaultDatabaseURL, "postgres://u@h:1/d"},
		{"REDIS_URL", testenv.RedisURL, testenv.DefaultRedisURL, "redis://h:2/3"},
		{"NATS_URL", testenv.NATSURL, testenv.DefaultNATSURL, "nats://h:1"},
		{"AMQP_URL", testenv.AMQPURL, testenv.DefaultAMQPURL, "amqp://u:p@h:2/"},
	} {
		t.Run(c.env, func(t *testing.T) {
			t.Setenv(c.env, "")
			if got := c.url(t); got != c.def {
				t.Fatalf("without %s: %q, want the default %q", c.env, got, c.def)
			}
			t.Setenv(c.env, c.set)
			if got := c.url(t); got != c.set {
				t.Fatalf("with %s=%q: %q", c.env, c.set, got)
			}
		})
	}
}

// With no URL set and Docker answering, the services come from this
// binary's containers: the same ones on every call. .ci/containers runs it
// with ONCEKEY_CONTAINERS_REQUIRED=1, where no Docker fails it; elsewhere
// (the README's test command, on machines without Docker) it is skipped.
func TestURLs_ContainersWhenDocker(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	needContainers(t)
	pg, rd := testenv.DatabaseURL(t), testenv.RedisURL(t)
	if pg == testenv.DefaultDatabaseURL || rd == testenv.DefaultRedisURL {
		t.Fatalf("Docker answers but the URLs are the local defaults: %q %q", pg, rd)
	}
	if again := testenv.DatabaseURL(t); again != pg {
		t.Fatalf("a second call started another PostgreSQL: %q, then %q", pg, again)
	}
	s := testenv.Postgres(t)
	if err := s.Pool.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	c, _ := testenv.Redis(t)
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
}

// The brokers too: with NATS_URL and AMQP_URL unset and Docker answering,
// NATS and RabbitMQ come from this binary's containers and answer (NATS
// with its INFO line, RabbitMQ with Connection.Start; this package holds
// no broker client).
func TestBrokerURLs_ContainersWhenDocker(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("AMQP_URL", "")
	needContainers(t)
	nu, au := testenv.NATSURL(t), testenv.AMQPURL(t)
	if nu == testenv.DefaultNATSURL || au == testenv.DefaultAMQPURL {
		t.Fatalf("Docker answers but the URLs are the local defaults: %q %q", nu, au)
	}
	if again := testenv.AMQPURL(t); again != au {
		t.Fatalf("a second call started another RabbitMQ: %q, then %q", au, again)
	}
	greeting := func(u, hello string) []byte {
		t.Helper()
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.DialTimeout("tcp", pu.Host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if hello != "" {
			if _, err := io.WriteString(c, hello); err != nil {
				t.Fatal(err)
			}
		}
		b := make([]byte, 7)
		if _, err := io.ReadFull(bufio.NewReader(c), b); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		return b
	}
	if b := greeting(nu, ""); string(b[:5]) != "INFO " {
		t.Fatalf("NATS greeted with %q", b)
	}
	// A method frame (type 1) on channel 0: Connection.Start.
	if b := greeting(au, "AMQP\x00\x00\x09\x01"); b[0] != 1 || b[1] != 0 || b[2] != 0 {
		t.Fatalf("RabbitMQ answered % x", b)
	}
}

// needContainers skips the test when no Docker daemon answers, or fails it
// under .ci/containers, which sets ONCEKEY_CONTAINERS_REQUIRED=1.
func needContainers(t *testing.T) {
	t.Helper()
	if testenv.ContainersEnabled() {
		return
	}
	if os.Getenv("ONCEKEY_CONTAINERS_REQUIRED") == "1" {
		t.Fatal("ONCEKEY_CONTAINERS_REQUIRED=1 but no Docker daemon answers (or ONCEKEY_CONTAINERS=off)")
	}
	t.Skip("no Docker daemon answers (or ONCEKEY_CONTAINERS=off)")
}
