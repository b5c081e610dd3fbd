package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/examples/internal/program"
	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the example on the test servers (PostgreSQL and Redis;
// with CI=true a missing server fails the test) and on the embedded
// stand-ins, and checks that the library's spans and main metrics come
// out through the OpenTelemetry SDK with the expected outcomes, and that
// the idempotency key is nowhere in the output.
func TestRun(t *testing.T) {
	for _, bc := range []struct {
		name   string
		config func(t *testing.T) backend.Config
	}{
		{"PostgresRedis", func(t *testing.T) backend.Config {
			s := testenv.Postgres(t)
			_, prefix := testenv.Redis(t)
			return backend.Config{Name: "telemetry", DatabaseURL: s.URL, RedisURL: testenv.RedisURL(t), RedisPrefix: prefix}
		}},
		{"Embedded", func(t *testing.T) backend.Config {
			return backend.Config{Name: "telemetry", DataDir: t.TempDir()}
		}},
	} {
		t.Run(bc.name, func(t *testing.T) {
			keys := []string{"3c1f2b9e-idempotency-key-of-the-test", "77d0a5e4-second-idempotency-key"}
			var out bytes.Buffer
			n := 0
			o := options{Flags: program.Flags{Backend: bc.config(t), Verbose: true}, newKey: func() string {
				n++
				return keys[(n-1)%len(keys)]
			}}
			if err := run(t.Context(), o, &out); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			s := out.String()
			for _, want := range []string{
				"1. first request: executed", "2. duplicate while it ran: in_progress", "3. retry after it finished: replayed",
				"4. the key reused for another order: refused", "6. another worker claims it after the lease ran out: acquired",
				"8. the stalled worker wakes up and completes: refused (claim.ErrFenced)",
				// spans
				"oncekey.claim ", "oncekey.redis.claim ", "oncekey.durable.claim ", "oncekey.durable.transaction ",
				"oncekey.outcome=executed", "oncekey.outcome=replayed", "oncekey.outcome=in_progress", "oncekey.operation_id=",
				"oncekey.finish ", "oncekey.durable.finish ", "oncekey.takeover=true", "oncekey.fenced=true",
				// the library's log lines, through slog
				`level=INFO msg="oncekey: took over an expired lease"`,
				// metrics
				"oncekey.claims:", "oncekey.claim.duration (s):", "oncekey.replays:", "oncekey.mismatches:", "oncekey.records:",
				"oncekey.takeovers: 1", "oncekey.fenced: 1",
			} {
				if !strings.Contains(s, want) {
					t.Errorf("the output lacks %q", want)
				}
			}
			for _, k := range keys {
				if strings.Contains(s, k) || strings.Contains(s, k[9:]) {
					t.Errorf("the output holds the raw idempotency key %q", k)
				}
			}
			if t.Failed() {
				t.Logf("output:\n%s", s)
			}
		})
	}
}

func TestParseOptions(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "postgres://db", "REDIS_URL": "redis://r"}
	var errb bytes.Buffer
	o, err := parseOptions([]string{"-v"}, func(k string) string { return env[k] }, &errb)
	if err != nil || o.Backend.DatabaseURL != "postgres://db" || o.Backend.RedisURL != "redis://r" || !o.Verbose || o.newKey == nil {
		t.Fatalf("options %+v, err %v", o, err)
	}
	if _, err := parseOptions([]string{"extra"}, func(string) string { return "" }, &errb); err == nil {
		t.Fatal("an extra argument was accepted")
	}
}
