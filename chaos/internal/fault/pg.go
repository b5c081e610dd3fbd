package fault

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BackendPID returns the PostgreSQL backend process of tx's connection, for
// [Terminate].
func BackendPID(ctx context.Context, tx pgx.Tx) (int32, error) {
	var pid int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return 0, fmt.Errorf("%w: pg_backend_pid: %w", ErrTerminate, err)
	}
	return pid, nil
}

// Terminate ends backend pid with pg_terminate_backend, from admin (a pool
// that is not the library's). The backend's open transaction is rolled
// back by the server and its client sees a lost connection at its next
// statement. It reports whether a backend was terminated.
func Terminate(ctx context.Context, admin *pgxpool.Pool, pid int32) (bool, error) {
	var ok bool
	if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil {
		return false, fmt.Errorf("%w: %w", ErrTerminate, err)
	}
	return ok, nil
}

// TerminateApp ends every backend whose application_name is app (set it in
// the library pool's runtime parameters), except admin's own. It returns
// how many it terminated.
func TerminateApp(ctx context.Context, admin *pgxpool.Pool, app string) (int, error) {
	var n int
	err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTerminate, err)
	}
	return n, nil
}

// CutMode says what an armed [CommitCutter] cuts after.
type CutMode int

const (
	// CutNone cuts nothing.
	CutNone CutMode = iota
	// CutCommit cuts after the next COMMIT (simple protocol, as pgx sends
	// it).
	CutCommit
	// CutStatement cuts after the next statement run with the extended
	// protocol (a Sync that follows an Execute): an autocommit UPDATE on a
	// pool, for example a fenced completion.
	CutStatement
)

// CommitCutter is a TCP proxy in front of PostgreSQL that loses one answer
// on demand. Once armed, it forwards the chosen message, waits until the
// server answers it (so the server applied it: a COMMIT is durable and
// visible before its reply is sent), drops the answer and closes both
// sides. The client sees a lost connection after sending: the ambiguous
// outcome of a COMMIT whose acknowledgement is lost.
type CommitCutter struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	mode  CutMode
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup

	cuts atomic.Int64
}

// NewCommitCutter listens on a free loopback port and forwards to target
// ("host:port").
func NewCommitCutter(target string) (*CommitCutter, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%w: commit cutter: %w", ErrProxy, err)
	}
	p := &CommitCutter{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.serve(c) }()
		}
	}()
	return p, nil
}

// Addr returns the listening address.
func (p *CommitCutter) Addr() string { return p.ln.Addr().String() }

// Arm makes the proxy cut after the next message of mode, on whichever
// connection sends it first.
func (p *CommitCutter) Arm(mode CutMode) {
	p.mu.Lock()
	p.mode = mode
	p.mu.Unlock()
}

// Cuts returns how many answers were lost so far.
func (p *CommitCutter) Cuts() int64 { return p.cuts.Load() }

// Close stops the proxy and closes its connections.
func (p *CommitCutter) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *CommitCutter) take(typ byte, body []byte, sawExec bool) bool {
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

func (p *CommitCutter) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = struct{}{}
}

func (p *CommitCutter) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *CommitCutter) serve(client net.Conn) {
	p.track(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		p.untrack(client)
		return
	}
	p.track(server)
	defer p.untrack(client, server)
	var cut atomic.Bool
	p.wg.Add(1)
	go func() { // server → client
		defer p.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && cut.Load() {
				// The server answered the cut message: it applied it.
				// Lose the answer and the connection.
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
		if startup {
			// Untyped: StartupMessage, SSLRequest, GSSENCRequest, CancelRequest.
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
