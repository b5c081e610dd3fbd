package fault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/oncekey/oncekey/fence"
)

// Behavior is what the [Downstream] does with one call.
type Behavior int

const (
	// Succeed applies the effect (once per operation) and answers 200.
	Succeed Behavior = iota
	// FailBefore answers 503 without doing anything: a transient failure
	// before any effect.
	FailBefore
	// TimeoutAfter applies the effect, then never answers (until the caller
	// gives up): the caller cannot know whether it applied.
	TimeoutAfter
	// Slow waits the plan's delay, then behaves like Succeed.
	Slow
)

// DownstreamOptions configure a [Downstream].
type DownstreamOptions struct {
	// Apply performs the business effect of operation op under tok, and
	// returns its identity. The downstream calls it once per operation it
	// accepts, again only after an error; it must not report an error for
	// an effect it applied. Required.
	Apply func(ctx context.Context, op string, tok fence.Token) (id string, err error)
	// Plan decides the behaviour of the n-th call (from 0) for op. Nil
	// means always Succeed.
	Plan func(op string, n int) (Behavior, time.Duration)
	// Raw applies every call the fence accepts, without deduplicating by
	// the operation identity: a second execution of an operation shows up
	// as a second effect instead of getting the first one back. Scenarios
	// that count effects set it.
	Raw bool
}

// Downstream is an HTTP dependency of the suite, the "other system" a
// workflow worker calls. It behaves as the design asks of downstream
// systems: it takes the caller's operation identity as its idempotency key
// (a repeated call gets the same effect back) and the fencing token as its
// fence (a call whose generation is lower than one it already saw is
// rejected with 409, and an equal generation is accepted only from the same
// owner). Faults come from [DownstreamOptions.Plan].
//
//	POST /effects   Idempotency-Key: <operation id>, Fencing-Token: <token>
//	                200 {"id": "..."} | 409 stale token | 503 failure
//	GET  /effects?op=<operation id>   200 {"id": "..."} | 404
type Downstream struct {
	opts DownstreamOptions
	srv  *http.Server
	ln   net.Listener
	done chan struct{}

	mu        sync.Mutex
	applied   map[string]string
	highest   map[string]fence.Token
	calls     map[string]int
	inflight  map[string]int
	maxIn     int
	conflicts []string
	stats     DownstreamStats
}

// DownstreamStats counts what a [Downstream] did.
type DownstreamStats struct {
	Calls, Applied, Failures, Timeouts, Slow, Stale int
}

// NewDownstream starts the server on a free loopback port.
func NewDownstream(opts DownstreamOptions) (*Downstream, error) {
	if opts.Apply == nil {
		return nil, errors.New("fault: NewDownstream: Apply is required")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%w: downstream: %w", ErrProxy, err)
	}
	d := &Downstream{
		opts: opts, ln: ln, done: make(chan struct{}),
		applied: map[string]string{}, highest: map[string]fence.Token{},
		calls: map[string]int{}, inflight: map[string]int{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /effects", d.post)
	mux.HandleFunc("GET /effects", d.get)
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.srv.Serve(ln) }()
	return d, nil
}

// URL returns the server's base URL.
func (d *Downstream) URL() string { return "http://" + d.ln.Addr().String() }

// Close stops the server; calls held by TimeoutAfter are let go.
func (d *Downstream) Close() {
	close(d.done)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = d.srv.Shutdown(ctx)
}

// Stats returns the counters so far.
func (d *Downstream) Stats() DownstreamStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// MaxInFlight returns the most calls for one operation the server ever had
// in progress at once.
func (d *Downstream) MaxInFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.maxIn
}

// Calls returns how many calls each operation received.
func (d *Downstream) Calls() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]int, len(d.calls))
	for k, v := range d.calls {
		out[k] = v
	}
	return out
}

// Conflicts lists calls that presented a generation already presented by
// another owner of the same operation: two owners holding one generation,
// which the durable store must never allow.
func (d *Downstream) Conflicts() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := append([]string(nil), d.conflicts...)
	sort.Strings(out)
	return out
}

// Lookup returns the effect applied for op, if any.
func (d *Downstream) Lookup(op string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	id, ok := d.applied[op]
	return id, ok
}

func (d *Downstream) post(w http.ResponseWriter, r *http.Request) {
	op := r.Header.Get("Idempotency-Key")
	tok, err := fence.Parse(r.Header.Get("Fencing-Token"))
	if op == "" || err != nil {
		http.Error(w, "missing Idempotency-Key or Fencing-Token", http.StatusBadRequest)
		return
	}
	d.mu.Lock()
	n := d.calls[op]
	d.calls[op] = n + 1
	d.stats.Calls++
	d.inflight[op]++
	d.maxIn = max(d.maxIn, d.inflight[op])
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.inflight[op]--
		d.mu.Unlock()
	}()

	behavior, delay := Succeed, time.Duration(0)
	if d.opts.Plan != nil {
		behavior, delay = d.opts.Plan(op, n)
	}
	switch behavior {
	case FailBefore:
		d.count(func(s *DownstreamStats) { s.Failures++ })
		http.Error(w, "downstream incident", http.StatusServiceUnavailable)
		return
	case Slow:
		d.count(func(s *DownstreamStats) { s.Slow++ })
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
		case <-d.done:
		}
	}
	id, status := d.apply(r.Context(), op, tok)
	if behavior == TimeoutAfter && status == http.StatusOK {
		d.count(func(s *DownstreamStats) { s.Timeouts++ })
		select { // the work is done; the answer never comes
		case <-r.Context().Done():
		case <-d.done:
		}
		return
	}
	switch status {
	case http.StatusOK:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
	case http.StatusConflict:
		http.Error(w, "stale fencing token", http.StatusConflict)
	default:
		http.Error(w, "effect failed", status)
	}
}

func (d *Downstream) count(f func(*DownstreamStats)) {
	d.mu.Lock()
	f(&d.stats)
	d.mu.Unlock()
}

// apply runs the fence and the deduplication, then the effect, under the
// server's lock (one operation at a time is plenty for the suite).
func (d *Downstream) apply(ctx context.Context, op string, tok fence.Token) (string, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h, ok := d.highest[op]; ok {
		switch {
		case tok.Generation < h.Generation:
			d.stats.Stale++
			return "", http.StatusConflict
		case tok.Generation == h.Generation && tok.Owner != h.Owner:
			d.conflicts = append(d.conflicts, fmt.Sprintf("%s: generation %d presented by two owners", op, tok.Generation))
			return "", http.StatusConflict
		}
	}
	d.highest[op] = tok
	if id, ok := d.applied[op]; ok && !d.opts.Raw {
		return id, http.StatusOK
	}
	// Once accepted, the work runs to its end even if the caller gives up
	// (a caller's timeout must not leave an effect applied but unrecorded).
	id, err := d.opts.Apply(context.WithoutCancel(ctx), op, tok)
	if err != nil {
		return "", http.StatusInternalServerError
	}
	d.applied[op] = id
	d.stats.Applied++
	return id, http.StatusOK
}

func (d *Downstream) get(w http.ResponseWriter, r *http.Request) {
	id, ok := d.Lookup(r.URL.Query().Get("op"))
	if !ok {
		http.Error(w, "no such effect", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
}

// ErrDownstream is returned by [CallDownstream] and [LookupDownstream] for
// an answer other than success; *DownstreamError carries the status.
var ErrDownstream = errors.New("fault: downstream")

// DownstreamError is a non-success answer of the [Downstream].
type DownstreamError struct{ Status int }

// Error returns the status in a sentence.
func (e *DownstreamError) Error() string {
	return fmt.Sprintf("fault: downstream answered %d", e.Status)
}

// Is reports whether target is ErrDownstream.
func (e *DownstreamError) Is(target error) bool { return target == ErrDownstream }

// CallDownstream posts the effect of op under tok to the downstream at
// base. It returns the effect's identity, a *[DownstreamError] for a 409 or
// 5xx, or the transport error (a timeout: the outcome is unknown).
func CallDownstream(ctx context.Context, c *http.Client, base, op string, tok fence.Token) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/effects", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", op)
	req.Header.Set("Fencing-Token", tok.String())
	return doDownstream(c, req)
}

// LookupDownstream asks the downstream at base what became of op: the
// effect's identity, or a *[DownstreamError] with status 404 when none was
// applied.
func LookupDownstream(ctx context.Context, c *http.Client, base, op string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/effects?op="+url.QueryEscape(op), nil)
	if err != nil {
		return "", err
	}
	return doDownstream(c, req)
}

func doDownstream(c *http.Client, req *http.Request) (string, error) {
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return "", &DownstreamError{Status: resp.StatusCode}
	}
	var v struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return "", err
	}
	return v.ID, nil
}
