package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/examples/internal/backend"
)

// The demo on the embedded default (SQLite, miniredis, in-process NATS):
// every expectation holds, and the story says so.
func TestDemo_EmbeddedDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	o := options{demo: true}
	o.Backend = backend.Config{Name: "consumer"}
	err := run(ctx, o, &out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"in-process server with JetStream", "nothing charged by the killed worker", "terminated, never charged", "every expectation held"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("story lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "FAIL") {
		t.Errorf("a failed expectation:\n%s", out.String())
	}
}

// The Kafka demo on the embedded default (SQLite, miniredis, kfake).
func TestDemo_Kafka_EmbeddedDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	o := options{demo: true, broker: "kafka"}
	o.Backend = backend.Config{Name: "consumer"}
	if err := run(ctx, o, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"in-process broker (kfake", "nothing charged by the killed worker", "never charged", "every expectation held"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("story lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "FAIL") {
		t.Errorf("a failed expectation:\n%s", out.String())
	}
}

func TestParseOptions_Broker(t *testing.T) {
	env := map[string]string{"KAFKA_BROKERS": "h:9092"}
	o, err := parseOptions([]string{"-broker", "kafka"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || o.broker != "kafka" || o.kafka != "h:9092" {
		t.Fatalf("%+v %v", o, err)
	}
	if _, err := parseOptions([]string{"-broker", "sqs"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Fatal("an unknown broker was accepted")
	}
}

func TestParseOptions_NATSFromEnv(t *testing.T) {
	env := map[string]string{"NATS_URL": "nats://h:1"}
	o, err := parseOptions([]string{"-demo"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || o.natsURL != "nats://h:1" || !o.demo {
		t.Fatalf("%+v %v", o, err)
	}
	if _, err := parseOptions([]string{"extra"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Fatal("an unexpected argument was accepted")
	}
}
