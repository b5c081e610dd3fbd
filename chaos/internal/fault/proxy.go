package fault

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy on a loopback port in front of one upstream (Redis
// or PostgreSQL), run in-process with toxiproxy. Point the client at
// [Proxy.Addr]; then add faults. Each fault method returns a function that
// removes the fault again.
//
// go-redis and pgx connect lazily: warm their pools (send a command) before
// adding a toxic, or the command under test is never sent on a proxied
// connection.
type Proxy struct {
	server *toxiproxy.ApiServer
	p      *toxiproxy.Proxy

	mu    sync.Mutex
	seq   int
	count atomic.Int64 // faults applied
}

var proxySeq atomic.Int64

// NewProxy starts a proxy on 127.0.0.1 with a free port, forwarding to
// upstream ("host:port"). Errors match [ErrProxy].
func NewProxy(upstream string) (*Proxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	name := fmt.Sprintf("chaos-%d", proxySeq.Add(1))
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("%w: start %s: %w", ErrProxy, name, err)
	}
	return &Proxy{server: srv, p: p}, nil
}

// Addr returns the proxy's listening address, "127.0.0.1:port". It stays the
// same across [Proxy.CutAll] and [Proxy.SetUpstream].
func (p *Proxy) Addr() string { return p.p.Listen }

// Upstream returns the address the proxy forwards to.
func (p *Proxy) Upstream() string {
	p.p.Lock()
	defer p.p.Unlock()
	return p.p.Upstream
}

// Faults returns how many faults (toxics, cuts) the proxy applied so far.
func (p *Proxy) Faults() int64 { return p.count.Load() }

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() { p.p.Stop() }

// Latency delays every chunk of reply (upstream to client) by d, plus or
// minus jitter. A reply delayed past the client's read timeout makes
// go-redis re-send the command (see [ScriptSends]).
func (p *Proxy) Latency(d, jitter time.Duration) (undo func(), err error) {
	return p.toxic("latency", "downstream", fmt.Sprintf(`{"latency": %d, "jitter": %d}`, d.Milliseconds(), jitter.Milliseconds()))
}

// Blackhole makes the proxy accept and forward nothing in either direction:
// requests are swallowed and no reply comes, the way a partitioned or frozen
// server looks to its clients. New connections are accepted too and hang.
func (p *Proxy) Blackhole() (undo func(), err error) {
	up, err := p.toxic("timeout", "upstream", `{"timeout": 0}`)
	if err != nil {
		return nil, err
	}
	down, err := p.toxic("timeout", "downstream", `{"timeout": 0}`)
	if err != nil {
		up()
		return nil, err
	}
	return func() { down(); up() }, nil
}

// CutAfter lets n more bytes of reply through on each connection and then
// closes it: the server applied the request, its answer is lost part-way.
func (p *Proxy) CutAfter(n int64) (undo func(), err error) {
	return p.toxic("limit_data", "downstream", fmt.Sprintf(`{"bytes": %d}`, n))
}

// CutAll closes every connection through the proxy at once (both sides) and
// keeps accepting new ones on the same address.
func (p *Proxy) CutAll() error {
	p.p.Stop()
	if err := p.restart(); err != nil {
		return err
	}
	p.count.Add(1)
	return nil
}

// SetUpstream points new connections at another upstream, and closes the
// current ones, the way a failover moves a virtual IP.
func (p *Proxy) SetUpstream(upstream string) error {
	p.p.Stop()
	p.p.Lock()
	p.p.Upstream = upstream
	p.p.Unlock()
	return p.restart()
}

func (p *Proxy) restart() error {
	var err error
	// The port was just released; on a busy machine the kernel may need a
	// moment before it can be bound again.
	for i := 0; i < 50; i++ {
		if err = p.p.Start(); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%w: restart on %s: %w", ErrProxy, p.p.Listen, err)
}

func (p *Proxy) toxic(typ, stream, attrs string) (func(), error) {
	p.mu.Lock()
	p.seq++
	name := fmt.Sprintf("%s-%s-%d", typ, stream, p.seq)
	p.mu.Unlock()
	body := fmt.Sprintf(`{"name": %q, "type": %q, "stream": %q, "toxicity": 1.0, "attributes": %s}`, name, typ, stream, attrs)
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		return nil, fmt.Errorf("%w: add %s: %w", ErrProxy, typ, err)
	}
	p.count.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() { _ = p.p.Toxics.RemoveToxic(context.Background(), name) })
	}, nil
}
