package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/examples/internal/backend"
)

// The demo's story holds on the embedded default (SQLite file, in-process
// Redis): every expectation it prints is checked by runDemo, which fails
// otherwise.
func TestDemo_EmbeddedDefault(t *testing.T) {
	var out bytes.Buffer
	o := options{backend: backend.Config{Name: "deploys", DataDir: t.TempDir(), RedisPrefix: "deploys-test"}, demo: true}
	if err := run(t.Context(), o, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"1. POST /deploys: 202", "10 × 202 with the same Location", "processing → completed", "another tenant's GET", ": 404", "Idempotent-Replayed: true", "1 deploy applied", "every expectation held"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the story lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseOptions(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "postgres://db", "REDIS_URL": "redis://r"}
	o, err := parseOptions([]string{"-demo"}, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err != nil || !o.demo || o.backend.DatabaseURL != "postgres://db" || o.backend.RedisURL != "redis://r" || o.addr != "127.0.0.1:8080" {
		t.Fatalf("parseOptions = %+v, %v", o, err)
	}
	if _, err := parseOptions([]string{"extra"}, func(string) string { return "" }, &bytes.Buffer{}); err == nil {
		t.Fatal("an extra argument was accepted")
	}
}
