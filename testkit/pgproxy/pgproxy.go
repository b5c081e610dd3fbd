// Package pgproxy is a TCP proxy in front of PostgreSQL that loses one reply
// on demand: the acknowledgement of a write the server applied. The
// durable/postgres tests and the chaos suite both use it to reproduce, at a
// chosen statement, the ambiguous outcome of a COMMIT whose reply is lost.
//
// Once armed, a [Cutter] forwards the chosen client message to the server,
// waits until the server answers it (so the server has applied it: a COMMIT
// is durable and visible before its reply is sent), drops that answer and
// closes both sides. The client sees a lost connection after sending.
//
//	c, err := pgproxy.New("tcp", "127.0.0.1:5432")
//	defer c.Close()
//	// connect the pool to c.Addr(), then:
//	c.Arm(pgproxy.CutCommit)
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package pgproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
)

// Mode says which client message an armed [Cutter] cuts after.
type Mode int

const (
	// CutNone cuts nothing.
	CutNone Mode = iota
	// CutCommit cuts after the next COMMIT sent with the simple protocol,
	// as pgx sends it.
	CutCommit
	// CutStatement cuts after the next statement run with the extended
	// protocol (a Sync that follows an Execute): a statement or batch in
	// autocommit on a pool, for example a fenced completion.
	CutStatement
)

// Cutter is the proxy. Its methods are safe for concurrent use.
type Cutter struct {
	ln      net.Listener
	network string // of the target: "tcp" or "unix"
	target  string // host:port, or a unix socket path

	mu    sync.Mutex
	mode  Mode
	onCut func()
	conns map[net.Conn]struct{}
	done  bool // Close was called
	down  bool // SetDown(true): the database is unreachable
	wg    sync.WaitGroup

	cuts atomic.Int64
}

// New listens on a free loopback TCP port and forwards every connection to
// target on network ("tcp" with "host:port", or "unix" with a socket path).
func New(network, target string) (*Cutter, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgproxy: %w", err)
	}
	p := &Cutter{ln: ln, network: network, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serve(c) })
		}
	})
	return p, nil
}

// Addr returns the listening address, "127.0.0.1:port".
func (p *Cutter) Addr() string { return p.ln.Addr().String() }

// Port returns the listening port.
func (p *Cutter) Port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

// Arm makes the proxy cut after the next message of mode, on whichever
// connection sends it first.
func (p *Cutter) Arm(mode Mode) { p.ArmThen(mode, nil) }

// ArmThen is [Cutter.Arm] with then run once the server answered the cut
// message and before the client's connection is closed: the moment the
// write has applied and its reply is being lost.
func (p *Cutter) ArmThen(mode Mode, then func()) {
	p.mu.Lock()
	p.mode = mode
	p.onCut = then
	p.mu.Unlock()
}

// SetDown makes the database unreachable through the proxy (true: every
// connection is closed and new ones are closed as soon as they are
// accepted, as an outage of the server looks to a client) or reachable
// again (false).
func (p *Cutter) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
		}
	}
}

// Cuts returns how many replies were lost so far.
func (p *Cutter) Cuts() int64 { return p.cuts.Load() }

// Close stops the proxy, closes its connections and waits for its
// goroutines.
func (p *Cutter) Close() {
	p.ln.Close()
	p.mu.Lock()
	p.done = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// take reports whether the message triggers the armed cut, and disarms.
func (p *Cutter) take(typ byte, body []byte, sawExec bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	hit := false
	switch p.mode {
	case CutCommit:
		q := strings.ToLower(strings.TrimSpace(string(bytes.TrimRight(body, "\x00"))))
		hit = typ == 'Q' && strings.HasPrefix(q, "commit")
	case CutStatement:
		hit = typ == 'S' && sawExec
	}
	if hit {
		p.mode = CutNone
	}
	return hit
}

// takeOnCut returns the function to run at the cut, once.
func (p *Cutter) takeOnCut() func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.onCut
	p.onCut = nil
	return f
}

// track records c so that Close closes it; after Close it closes c and
// returns false.
func (p *Cutter) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done || p.down {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Cutter) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *Cutter) serve(client net.Conn) {
	if !p.track(client) {
		return
	}
	server, err := net.Dial(p.network, p.target)
	if err != nil {
		p.untrack(client)
		return
	}
	defer p.untrack(client, server)
	if !p.track(server) {
		return
	}
	var cut atomic.Bool
	p.wg.Go(func() { // server → client
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && cut.Load() {
				// The server answered the cut message: it applied it.
				// Lose the answer and the connection.
				if f := p.takeOnCut(); f != nil {
					f()
				}
				p.cuts.Add(1)
				client.Close()
				server.Close()
				return
			}
			if n > 0 {
				if _, err := client.Write(buf[:n]); err != nil {
					server.Close()
					return
				}
			}
			if err != nil {
				client.Close()
				return
			}
		}
	})
	// client → server, message by message.
	r := bufio.NewReader(client)
	startup, sawExec := true, false
	for {
		var msg []byte
		if startup {
			// Untyped: StartupMessage, SSLRequest, GSSENCRequest or
			// CancelRequest.
			var hdr [4]byte
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return
			}
			n := binary.BigEndian.Uint32(hdr[:])
			if n < 8 || n > 1<<20 {
				return
			}
			msg = make([]byte, n)
			copy(msg, hdr[:])
			if _, err := io.ReadFull(r, msg[4:]); err != nil {
				return
			}
			code := binary.BigEndian.Uint32(msg[4:8])
			startup = code == 80877103 || code == 80877104 // SSL / GSS request: the startup follows
		} else {
			var hdr [5]byte
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return
			}
			typ := hdr[0]
			n := binary.BigEndian.Uint32(hdr[1:])
			if n < 4 || n > 1<<30 {
				return
			}
			msg = make([]byte, 1+n)
			copy(msg, hdr[:])
			if _, err := io.ReadFull(r, msg[5:]); err != nil {
				return
			}
			if typ == 'E' {
				sawExec = true
			}
			if p.take(typ, msg[5:], sawExec) {
				cut.Store(true) // before the server can answer
			}
			if typ == 'S' {
				sawExec = false
			}
		}
		if _, err := server.Write(msg); err != nil {
			return
		}
	}
}
