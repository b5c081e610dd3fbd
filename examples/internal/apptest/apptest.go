// Package apptest is the test setup the end-to-end tests of orders and
// payments share: the two backends every test runs on (the embedded
// default, and real PostgreSQL and Redis found by testkit/testenv), the
// demo run on each, the service under test behind an httptest server, and
// the requests sent to it, read back in full. The routers tests take their
// store from it too.
//
// It is an internal package because it is scaffolding for the examples'
// tests, not part of the library.
package apptest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/examples/internal/backend"
	"github.com/oncekey/oncekey/examples/internal/program"
	"github.com/oncekey/oncekey/examples/internal/web"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// RedisTimeout is the Redis budget in tests. Under -race on a busy
// machine the in-process Redis runs its scripts many times slower than
// usual; a timed-out Redis step leaves its lease in place, and duplicates
// are told "in progress" until it expires, which would make the tests slow
// (correctness does not depend on Redis either way).
const RedisTimeout = 5 * time.Second

// Embedded is the embedded default for the program name: a SQLite file in
// the test's temporary folder and an in-process Redis.
func Embedded(t *testing.T, name string) backend.Config {
	return backend.Config{Name: name, DataDir: t.TempDir(), RedisTimeout: RedisTimeout}
}

// RealServers names a fresh PostgreSQL schema and a fresh Redis key
// prefix, both removed when the test ends (with CI=true a missing server
// fails the test).
func RealServers(t *testing.T, name string) backend.Config {
	s := testenv.Postgres(t)
	_, prefix := testenv.Redis(t)
	return backend.Config{Name: name, DatabaseURL: s.URL, RedisURL: testenv.RedisURL(t), RedisPrefix: prefix, RedisTimeout: RedisTimeout}
}

// ForEachBackend runs test as a parallel subtest on each of the two
// configurations every end-to-end test runs on: Embedded and
// PostgresRedis (RealServers).
func ForEachBackend(t *testing.T, name string, test func(t *testing.T, cfg backend.Config)) {
	t.Parallel()
	for _, bc := range []struct {
		name   string
		config func(*testing.T, string) backend.Config
	}{
		{"Embedded", Embedded},
		{"PostgresRedis", RealServers},
	} {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			test(t, bc.config(t, name))
		})
	}
}

// ForEachFixture runs test as ForEachBackend does, on the fixture setup
// builds on each backend.
func ForEachFixture[F any](t *testing.T, name string, setup func(*testing.T, backend.Config) F, test func(t *testing.T, f F)) {
	ForEachBackend(t, name, func(t *testing.T, cfg backend.Config) {
		test(t, setup(t, cfg))
	})
}

// Demo is a program's demo as the tests run it: as the command line
// "-demo" runs it, in an empty environment, on the embedded default or on
// the test servers.
type Demo[O any] struct {
	// Parse and Run are the program's parseOptions and run.
	Parse func(args []string, getenv func(string) string, stderr io.Writer) (O, error)
	Run   func(ctx context.Context, o O, out io.Writer) error
	// Flags returns the flags every program has, in o (&o.Flags).
	Flags func(o *O) *program.Flags
	// Story is what the demo's output must hold ([WantStory]).
	Story []string
}

// Embedded runs the demo with no service named: it fails the test if the
// options "-demo" gives name a service or a data folder (the program would
// not run on its embedded default), gives the run the tests' Redis budget
// ([RedisTimeout]) and fails the test unless the demo returns nil and its
// output tells the story. It returns the output.
func (d Demo[O]) Embedded(t *testing.T) string {
	t.Helper()
	o := d.parse(t)
	f := d.Flags(&o)
	if cfg := f.Backend; cfg.DatabaseURL != "" || cfg.RedisURL != "" || cfg.DataDir != "" {
		t.Fatalf("options name services: %+v", cfg)
	}
	f.Backend.RedisTimeout = RedisTimeout
	return d.run(t, o)
}

// OnRealServers runs the demo on the test servers ([RealServers]) and
// fails the test unless it returns nil, its output tells the story and
// says it runs on PostgreSQL.
func (d Demo[O]) OnRealServers(t *testing.T) {
	t.Helper()
	o := d.parse(t)
	f := d.Flags(&o)
	f.Backend = RealServers(t, f.Backend.Name)
	if out := d.run(t, o); !strings.Contains(out, "durable store: PostgreSQL at ") {
		t.Errorf("output does not name PostgreSQL:\n%s", out)
	}
}

// WantStory fails the test unless out, the output of a run of the demo,
// tells its story and reports no failure.
func (d Demo[O]) WantStory(t *testing.T, out string) {
	t.Helper()
	WantStory(t, out, d.Story...)
}

// parse returns the options of the command line "-demo" in an empty
// environment; it fails the test on an error.
func (d Demo[O]) parse(t *testing.T) O {
	t.Helper()
	o, err := d.Parse([]string{"-demo"}, EmptyEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// run runs the demo with options o and returns what it printed; it fails
// the test unless the run returns nil and the output tells the story.
func (d Demo[O]) run(t *testing.T, o O) string {
	t.Helper()
	var out bytes.Buffer
	if err := d.Run(t.Context(), o, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, &out)
	}
	d.WantStory(t, out.String())
	return out.String()
}

// Open opens cfg, closed when the test ends.
func Open(t *testing.T, cfg backend.Config) *backend.Backend {
	t.Helper()
	b, err := backend.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// Client sends requests to the service under test; T is the service's
// JSON answer.
type Client[T any] struct {
	t *testing.T
	// URL is the httptest server's base URL.
	URL string
	// Plain retries nothing.
	Plain *http.Client
	// Base holds the connections; retrying transports go over it.
	Base *http.Transport
}

// Serve serves h behind an httptest server until the test ends.
func Serve[T any](t *testing.T, h http.Handler) *Client[T] {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(base.CloseIdleConnections)
	return &Client[T]{t: t, URL: srv.URL, Base: base, Plain: &http.Client{Transport: base, Timeout: 30 * time.Second}}
}

// Response is one answer, read in full.
type Response[T any] struct {
	Status  int
	Header  http.Header
	Body    string
	Problem web.ProblemDoc // set for problem+json answers
	Value   T              // set for application/json answers
}

// Replayed says whether the answer is marked Idempotent-Replayed: true.
func (r Response[T]) Replayed() bool { return r.Header.Get(claimclient.HeaderReplayed) == "true" }

// Post sends POST path with a JSON body through rt (the plain client when
// nil). tenant "" sends no credential, key "" no key.
func (c *Client[T]) Post(rt http.RoundTripper, path, tenant, key, body string) Response[T] {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.t.Context(), http.MethodPost, c.URL+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer "+tenant)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", strconv.Quote(key)) // the draft's sf-string form
	}
	return c.Do(rt, req)
}

// PostAtOnce sends n POST path requests as tenant, with one key and body,
// at once, each through a retrying transport of its own (up to 20
// attempts), and fails the test unless every one is answered 201 with the
// first's body. It returns the answers.
func (c *Client[T]) PostAtOnce(n int, path, tenant, key, body string) []Response[T] {
	c.t.Helper()
	replies := make([]Response[T], n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = c.Post(c.Transport(claimclient.WithMaxAttempts(20)), path, tenant, key, body)
		})
	}
	wg.Wait()
	for i, r := range replies {
		if r.Status != http.StatusCreated || r.Body != replies[0].Body {
			c.t.Fatalf("client %d: %d %s; client 0: %d %s", i, r.Status, r.Body, replies[0].Status, replies[0].Body)
		}
	}
	return replies
}

// Get sends GET path as tenant with the plain client.
func (c *Client[T]) Get(tenant, path string) Response[T] {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.t.Context(), http.MethodGet, c.URL+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tenant)
	return c.Do(nil, req)
}

// Do sends req through rt (the plain client when nil) and reads the
// answer; a failed request is a test error and a zero Response.
func (c *Client[T]) Do(rt http.RoundTripper, req *http.Request) Response[T] {
	c.t.Helper()
	hc := c.Plain
	if rt != nil {
		hc = &http.Client{Transport: rt, Timeout: 60 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		c.t.Errorf("%s %s: %v", req.Method, req.URL.Path, err)
		return Response[T]{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Errorf("read body: %v", err)
	}
	r := Response[T]{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
	switch mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt {
	case web.ProblemContentType:
		if err := json.Unmarshal(b, &r.Problem); err != nil {
			c.t.Errorf("problem %s: %v", b, err)
		}
	case "application/json":
		_ = json.Unmarshal(b, &r.Value)
	}
	return r
}

// Transport returns a retrying client transport over Base, with its own
// retry budget.
func (c *Client[T]) Transport(opts ...claimclient.Option) *claimclient.Transport {
	c.t.Helper()
	tr, err := claimclient.NewTransport(c.Base, opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	return tr
}

// WantStatus fails the test unless r has status and, for a problem, the
// problem type ("" for none).
func WantStatus[T any](t *testing.T, what string, r Response[T], status int, problemType string) {
	t.Helper()
	if r.Status != status || r.Problem.Type != problemType {
		t.Fatalf("%s: %d %q %s; want %d %q", what, r.Status, r.Problem.Type, r.Body, status, problemType)
	}
}

// WantStory fails the test unless a demo's output holds each of wants and
// reports no failure.
func WantStory(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FAILED") {
		t.Errorf("demo output reports a failure:\n%s", out)
	}
}

// EmptyEnv is an environment with nothing set.
func EmptyEnv(string) string { return "" }
