package postgres_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// cutMode says which client message the proxy cuts after.
type cutMode int

const (
	cutNone cutMode = iota
	// cutCommit: the next simple-protocol COMMIT.
	cutCommit
	// cutExec: the next Sync that follows an Execute, i.e. the next
	// statement (or batch) that runs, in autocommit on the pool.
	cutExec
)

// cutProxy is a TCP proxy in front of PostgreSQL that loses one reply on
// demand. Once armed, it forwards the chosen message to the server, waits
// until the server answers it (so the server has applied it: a COMMIT is
// durable and visible before its reply is sent), drops that answer and
// closes both sides. The client then sees a lost connection after sending:
// the ambiguous outcome of issue 2, reproduced deterministically.
type cutProxy struct {
	ln     net.Listener
	target string // host:port, or a unix socket path

	mu    sync.Mutex
	mode  cutMode
	conns []net.Conn

	cuts atomic.Int64 // how many replies were lost

	// onCut, when set, runs once the server answered the cut message and
	// before the client's connection is closed: the moment when the write
	// applied and its reply is lost.
	onCut func()
}

func newCutProxy(t testing.TB, network, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &cutProxy{ln: ln, target: target}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(network, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	return p
}

func (p *cutProxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

// arm makes the proxy cut after the next message of mode.
func (p *cutProxy) arm(mode cutMode) { p.armThen(mode, nil) }

// armThen is arm, with then run when the cut happens (see onCut).
func (p *cutProxy) armThen(mode cutMode, then func()) {
	p.mu.Lock()
	p.mode = mode
	p.onCut = then
	p.mu.Unlock()
}

// takeOnCut returns the function to run at the cut, once.
func (p *cutProxy) takeOnCut() func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.onCut
	p.onCut = nil
	return f
}

// take reports whether the message triggers the armed cut, and disarms.
func (p *cutProxy) take(typ byte, body []byte, sawExec bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	hit := false
	switch p.mode {
	case cutCommit:
		q := strings.ToLower(strings.TrimSpace(string(bytes.TrimRight(body, "\x00"))))
		hit = typ == 'Q' && strings.HasPrefix(q, "commit")
	case cutExec:
		hit = typ == 'S' && sawExec
	}
	if hit {
		p.mode = cutNone
	}
	return hit
}

func (p *cutProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *cutProxy) serve(network string, client net.Conn) {
	p.track(client)
	server, err := net.Dial(network, p.target)
	if err != nil {
		client.Close()
		return
	}
	p.track(server)
	var cut atomic.Bool
	go func() { // server → client
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
	}()
	// client → server, message by message.
	r := bufio.NewReader(client)
	startup, sawExec := true, false
	for {
		var msg []byte
		var typ byte
		if startup {
			// Untyped: StartupMessage, SSLRequest, GSSENCRequest or
			// CancelRequest.
			var hdr [4]byte
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				break
			}
			n := binary.BigEndian.Uint32(hdr[:])
			if n < 8 || n > 1<<20 {
				break
			}
			msg = make([]byte, n)
			copy(msg, hdr[:])
			if _, err := io.ReadFull(r, msg[4:]); err != nil {
				break
			}
			code := binary.BigEndian.Uint32(msg[4:8])
			startup = code == 80877103 || code == 80877104 // SSL / GSS request: the startup follows
		} else {
			var hdr [5]byte
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				break
			}
			typ = hdr[0]
			n := binary.BigEndian.Uint32(hdr[1:])
			if n < 4 || n > 1<<30 {
				break
			}
			msg = make([]byte, 1+n)
			copy(msg, hdr[:])
			if _, err := io.ReadFull(r, msg[5:]); err != nil {
				break
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
			break
		}
	}
	server.Close()
	client.Close()
}
