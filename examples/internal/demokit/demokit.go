// Package demokit is what the demos of orders and payments share: the
// score (printed lines, failed expectations), the requests they send and
// the replies they read back, fresh idempotency keys, and a transport that
// counts the 409 in-progress answers the client's retrying transport
// waited out.
//
// The story each demo tells, and what it expects of oncekey, stays in the
// example's demo.go. It is an internal package because it is scaffolding
// for the examples, not part of the library.
package demokit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/examples/internal/web"
)

// Score prints a demo's lines to Out and counts its failed expectations.
// Its methods are safe for concurrent use.
type Score struct {
	Out io.Writer

	mu    sync.Mutex
	fails int
}

// Say prints one line.
func (s *Score) Say(format string, args ...any) {
	fmt.Fprintf(s.Out, format+"\n", args...)
}

// Expect counts a failure and prints it, indented, unless ok.
func (s *Score) Expect(ok bool, format string, args ...any) {
	if ok {
		return
	}
	s.mu.Lock()
	s.fails++
	s.mu.Unlock()
	fmt.Fprintf(s.Out, "   FAILED: "+format+"\n", args...)
}

// Verdict returns errDemo wrapped with the number of failed expectations,
// or, when every one held, says so and returns nil.
func (s *Score) Verdict(errDemo error) error {
	s.mu.Lock()
	fails := s.fails
	s.mu.Unlock()
	if fails > 0 {
		return fmt.Errorf("%w: %d", errDemo, fails)
	}
	s.Say("demo: every expectation held")
	return nil
}

// Reply is what came back from one request; T is the service's JSON
// answer.
type Reply[T any] struct {
	Err      error
	Status   int
	Replayed bool // Idempotent-Replayed: true
	Location string
	Body     []byte
	Problem  web.ProblemDoc // set for problem+json answers
	Value    T              // set for application/json answers
}

// String reads like "201 (Idempotent-Replayed: true)" or "422 Idempotency
// key reused".
func (r Reply[T]) String() string {
	switch {
	case r.Err != nil:
		return "error: " + r.Err.Error()
	case r.Problem.Type != "":
		return fmt.Sprintf("%d %s", r.Status, r.Problem.Title)
	case r.Replayed:
		return fmt.Sprintf("%d (%s: true)", r.Status, claimclient.HeaderReplayed)
	}
	return fmt.Sprint(r.Status)
}

// Demo is one run of a demo against the service at Base: its score, and
// its requests for the resource at Path, answered with a T.
type Demo[T any] struct {
	Score
	Ctx  context.Context
	Base string
	Path string
}

// Post sends POST Path as tenant with a JSON body; key "" sends none.
func (d *Demo[T]) Post(c *http.Client, tenant, key, body string) Reply[T] {
	return Post[T](d.Ctx, c, d.Base+d.Path, tenant, key, body)
}

// Get sends GET path as tenant.
func (d *Demo[T]) Get(c *http.Client, tenant, path string) Reply[T] {
	return Get[T](d.Ctx, c, d.Base+path, tenant)
}

// RawClient returns a client that sends what it is given and retries
// nothing, and the function that closes its idle connections.
func RawClient() (*http.Client, func()) {
	plain := &http.Transport{}
	return &http.Client{Transport: plain, Timeout: 10 * time.Second}, plain.CloseIdleConnections
}

// Post sends POST url as tenant with a JSON body; key "" sends none.
func Post[T any](ctx context.Context, c *http.Client, url, tenant, key, body string) Reply[T] {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return Reply[T]{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tenant)
	if key != "" {
		req.Header.Set("Idempotency-Key", strconv.Quote(key)) // the draft's sf-string form
	}
	return Do[T](c, req)
}

// Get sends GET url as tenant.
func Get[T any](ctx context.Context, c *http.Client, url, tenant string) Reply[T] {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Reply[T]{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+tenant)
	return Do[T](c, req)
}

// Do sends req with c and reads the reply in full.
func Do[T any](c *http.Client, req *http.Request) Reply[T] {
	resp, err := c.Do(req)
	if err != nil {
		return Reply[T]{Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	r := Reply[T]{Err: err, Status: resp.StatusCode, Body: body, Location: resp.Header.Get("Location"),
		Replayed: resp.Header.Get(claimclient.HeaderReplayed) == "true"}
	switch mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt {
	case web.ProblemContentType:
		_ = json.Unmarshal(body, &r.Problem)
	case "application/json":
		_ = json.Unmarshal(body, &r.Value)
	}
	return r
}

// Duplicates sends one request n times at once, as n clients would after
// a double-click or in a retry storm: send sends it through the transport
// it is given, one pool of connections shared by all that counts the 409
// in-progress answers passing through. It returns the replies, in order,
// and that count.
func Duplicates[T any](n int, send func(pool http.RoundTripper) Reply[T]) (replies []Reply[T], conflicts int64) {
	pool := &http.Transport{MaxIdleConnsPerHost: n}
	defer pool.CloseIdleConnections()
	counted := &ConflictCounter{Base: pool}
	replies = make([]Reply[T], n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = send(counted) })
	}
	wg.Wait()
	return replies, counted.Conflicts()
}

// Tally expects every reply to be a 201 with the body of the first, and
// counts the 201s and those that ran (not replayed).
func Tally[T any](s *Score, replies []Reply[T]) (created, executed int) {
	for i, r := range replies {
		s.Expect(r.Err == nil && r.Status == http.StatusCreated, "request %d: %s, want 201", i+1, r)
		s.Expect(string(r.Body) == string(replies[0].Body), "request %d got another body than request 1", i+1)
		if r.Status == http.StatusCreated {
			created++
			if !r.Replayed {
				executed++
			}
		}
	}
	return created, executed
}

// MustKey returns a fresh idempotency key (claimclient.NewKey); it panics
// only if the system's random source fails.
func MustKey() string {
	k, err := claimclient.NewKey()
	if err != nil {
		panic(err)
	}
	return k
}

// ConflictCounter counts the 409 answers that pass through it.
type ConflictCounter struct {
	Base      http.RoundTripper
	conflicts atomic.Int64
}

// RoundTrip sends req through Base.
func (c *ConflictCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.Base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusConflict {
		c.conflicts.Add(1)
	}
	return resp, err
}

// Conflicts returns how many 409 answers passed through.
func (c *ConflictCounter) Conflicts() int64 { return c.conflicts.Load() }
