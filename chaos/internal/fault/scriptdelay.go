package fault

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ScriptDelay is a TCP proxy in front of Redis that, while on, delays the
// reply to every Lua script (EVAL, EVALSHA) by a set time and forwards
// everything else at once, so that connection handshakes still succeed
// and only the scripts' replies come late. A reply later than the client's
// read timeout makes go-redis re-send the script: the server then runs it
// more than once (see [ScriptSends]).
type ScriptDelay struct {
	ln       net.Listener
	upstream string
	delay    atomic.Int64 // nanoseconds; 0 is off
	delayed  atomic.Int64
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// NewScriptDelay listens on a free loopback port and forwards to upstream.
func NewScriptDelay(upstream string) (*ScriptDelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%w: script delay: %w", ErrProxy, err)
	}
	p := &ScriptDelay{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.handle(c) }()
		}
	}()
	return p, nil
}

// Addr returns the listening address.
func (p *ScriptDelay) Addr() string { return p.ln.Addr().String() }

// Set delays script replies by d from now on; 0 turns the delay off.
func (p *ScriptDelay) Set(d time.Duration) { p.delay.Store(int64(d)) }

// Delayed returns how many script replies were delayed.
func (p *ScriptDelay) Delayed() int64 { return p.delayed.Load() }

// Close stops the proxy and closes its connections.
func (p *ScriptDelay) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *ScriptDelay) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *ScriptDelay) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *ScriptDelay) handle(client net.Conn) {
	server, err := net.Dial("tcp", p.upstream)
	if err != nil {
		client.Close()
		return
	}
	p.track(client, server)
	defer p.untrack(client, server)
	var pending atomic.Int64 // script replies of this connection still to delay
	p.wg.Add(1)
	go func() { // client → server, watching for scripts
		defer p.wg.Done()
		defer server.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				up := bytes.ToUpper(buf[:n])
				if p.delay.Load() > 0 && bytes.Contains(up, []byte("EVAL")) {
					pending.Add(1)
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for { // server → client, late while scripts are pending
		n, err := server.Read(buf)
		if n > 0 {
			if pending.Load() > 0 {
				pending.Add(-1)
				if d := time.Duration(p.delay.Load()); d > 0 {
					p.delayed.Add(1)
					time.Sleep(d)
				}
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
