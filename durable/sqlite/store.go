package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	_ "github.com/ncruces/go-sqlite3/driver" // registers the "sqlite3" database/sql driver

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/driver/storeopt"
	"github.com/oncekey/oncekey/durable/driver/txmark"
)

// Defaults of the options.
const (
	defaultTable       = "idempotency_requests"
	defaultBusyTimeout = 5 * time.Second
)

// maxConns bounds the connections of a database from Open: one writer at a
// time plus concurrent readers (WAL lets them all run at once).
const maxConns = 8

// Compile-time check: store implements the contract with *sql.Tx.
var _ storeapi.Store[*sql.Tx] = (*store)(nil)

// Option configures [New], [Open] and [Migrate].
type Option func(*config) error

type config struct {
	table       string
	secret      []byte
	busyTimeout time.Duration
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// WithTable sets the table name. It must be a plain SQL identifier (letters,
// digits and '_', not starting with a digit nor with "sqlite_", at most 63
// bytes). Defaults to "idempotency_requests".
func WithTable(name string) Option {
	return func(c *config) error {
		if !identRE.MatchString(name) || strings.HasPrefix(strings.ToLower(name), "sqlite_") {
			return fmt.Errorf("%w: WithTable: %q is not a plain identifier", ErrConfig, name)
		}
		c.table = name
		return nil
	}
}

// WithKeySecret makes the store hash idempotency keys with
// HMAC-SHA-256(secret, key) instead of SHA-256, so a copy of the database
// file cannot be matched against guessed keys (see [durable.Scope.Ref]). The
// same secret must be used every time the file is opened. The slice is
// copied; it must not be empty.
func WithKeySecret(secret []byte) Option {
	s := append([]byte(nil), secret...)
	return func(c *config) error {
		if err := storeopt.CheckKeySecret(ErrConfig, s); err != nil {
			return err
		}
		c.secret = s
		return nil
	}
}

// WithBusyTimeout sets how long a write waits for the database to be free:
// for another write of the same store (an open InTx holds the write lock
// until it ends) and, for a database from [Open], for another connection or
// process (SQLite's busy_timeout). After it, the write fails with
// [durable.ErrUnavailable]. Defaults to 5s; at least 1ms and less than 30s,
// an error wrapping [ErrConfig] otherwise: the generations a store hands out
// after a sweep rely on a claim never waiting anywhere near a minute (see the
// durable package's "Generations"). For a database the caller opened, its
// DSN's busy_timeout is the caller's to set, under the same bound.
func WithBusyTimeout(d time.Duration) Option {
	return func(c *config) error {
		if err := storeopt.CheckLockWait(ErrConfig, "WithBusyTimeout", d); err != nil {
			return err
		}
		c.busyTimeout = d
		return nil
	}
}

func newConfig(opts []Option) (config, error) {
	return storeopt.Apply(config{table: defaultTable, busyTimeout: defaultBusyTimeout}, opts)
}

// store is the SQLite implementation of [durable.Store] with *sql.Tx
// transactions. It is safe for concurrent use.
type store struct {
	txmark.Mark[*sql.Tx] // a durable.Store[*sql.Tx]
	db                   *sql.DB
	locking              bool // transactions start deferred: take the write lock explicitly
	cfg                  config
	wlock                chan struct{}
	stmts                atomic.Int64 // statements run, BEGIN and COMMIT included (tests, benchmarks)
	waiters              atomic.Int64 // writes waiting in lockWrites (tests)
	q                    queries
	// stmtCache maps a query to its *sql.Stmt.
	stmtCache sync.Map
}

// opened holds the databases [Open] made (weakly): their transactions begin
// IMMEDIATE, so [New] need not take the write lock with a first statement,
// and [Migrate] checks that they are in WAL mode.
var opened sync.Map // weak.Pointer[sql.DB] → struct{}

func openedByOpen(db *sql.DB) bool {
	_, ok := opened.Load(weak.Make(db))
	return ok
}

// Open returns a *sql.DB for the SQLite database file at path (created if
// needed on first use), for [New] and [Migrate], and for the caller's own
// tables in the same file. Like sql.Open it does not touch the file: the
// first statement does ([Migrate], at start-up). The caller closes it.
//
// Every connection is configured with journal_mode=WAL (readers never block
// the writer), synchronous=FULL (a commit is on disk before it returns, so a
// completion survives a power loss, not only a process crash), a
// busy_timeout of the busy timeout, foreign_keys on, and BEGIN IMMEDIATE for
// write transactions (so a transaction takes the write lock at its start and
// never fails when upgrading a read lock). It keeps at most 8 connections.
//
// path is a file name, not a URI: "", ":memory:" (each connection would see
// its own database) and names containing '?' are rejected with an error
// wrapping [ErrConfig], as are invalid options. [Migrate] returns
// [durable.ErrUnavailable] for a file that cannot be opened and an error
// wrapping [ErrConfig] for one that cannot use WAL mode.
func Open(path string, opts ...Option) (*sql.DB, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	switch {
	case path == "", path == ":memory:", strings.HasPrefix(path, "file:"), strings.ContainsAny(path, "?\x00"):
		return nil, fmt.Errorf("%w: Open: path %q must be a plain file name", ErrConfig, path)
	}
	dsn := fileURI(path, "_pragma="+fmt.Sprintf("busy_timeout(%d)", cfg.busyTimeout.Milliseconds())+
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_txlock=immediate")
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, translate("open", err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	key := weak.Make(db)
	opened.Store(key, struct{}{})
	runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { opened.Delete(k) }, key)
	return db, nil
}

// New returns a [durable.Store] on db, with *sql.Tx as its transaction type;
// it is safe for concurrent use. db comes from [Open], or is one the caller
// opened with the "sqlite3" driver (github.com/ncruces/go-sqlite3/driver,
// which this package imports), whose DSN should then set what Open sets
// ("_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)";
// "_txlock=immediate" is optional: InTx takes the write lock with its first
// statement either way). Either way db stays the caller's: the store prepares
// its statements on it, and they are closed when db is. New does not touch
// the database; call [Migrate] first. It returns an error wrapping
// [ErrConfig] for a nil db or an invalid option.
func New(db *sql.DB, opts ...Option) (durable.Store[*sql.Tx], error) {
	if db == nil {
		return nil, fmt.Errorf("%w: New: nil *sql.DB", ErrConfig)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return newStore(db, cfg), nil
}

// driverName is the database/sql driver that
// github.com/ncruces/go-sqlite3/driver registers.
const driverName = "sqlite3"

// fileURI is the SQLite URI of the file name path with the query: the
// name is escaped, so '#', '%' and spaces in it stay part of the name.
func fileURI(path, query string) string {
	u := url.URL{Scheme: "file", RawQuery: query}
	p := filepath.ToSlash(path)
	if filepath.IsAbs(path) {
		if !strings.HasPrefix(p, "/") {
			p = "/" + p // a Windows volume: file:///C:/...
		}
		u.Path = p // file:///abs/path: an empty authority
	} else {
		u.Path, u.OmitHost = p, true // file:rel/path
	}
	return u.String()
}

func newStore(db *sql.DB, cfg config) *store {
	return &store{
		db:      db,
		cfg:     cfg,
		locking: !openedByOpen(db), // Open's DSN begins IMMEDIATE
		wlock:   make(chan struct{}, 1),
		q:       buildQueries(cfg.table),
	}
}

// closeStmts closes the statements the store prepared on its database.
func (s *store) closeStmts() {
	s.stmtCache.Range(func(k, v any) bool {
		s.stmtCache.Delete(k)
		v.(*sql.Stmt).Close()
		return true
	})
}

// Ref returns the stored identity of sc, hashing its key with the store's
// secret if [WithKeySecret] was given. For an invalid scope it returns an
// error matching [durable.ErrInvalidScope] that names the field.
func (s *store) Ref(sc durable.Scope) (durable.Ref, error) {
	if err := sc.Validate(); err != nil {
		return durable.Ref{}, err
	}
	return sc.Ref(s.cfg.secret), nil
}

// lockWrites serializes the writes of this Store in the process, so that
// concurrent writers queue in Go instead of polling SQLite's busy handler.
// It waits at most the busy timeout, and no longer than ctx.
func (s *store) lockWrites(ctx context.Context) (unlock func(), err error) {
	select {
	case s.wlock <- struct{}{}:
		return s.unlockWrites, nil
	default:
	}
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	t := time.NewTimer(s.cfg.busyTimeout)
	defer t.Stop()
	select {
	case s.wlock <- struct{}{}:
		return s.unlockWrites, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, errWriteLockTimeout
	}
}

func (s *store) unlockWrites() { <-s.wlock }

// querier is what *sql.DB and *sql.Tx have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// prepared returns the statement for query on q, prepared once per Store
// (database/sql prepares it again on each connection that runs it, once).
// Parsing a statement costs more than running it in SQLite.
func (s *store) prepared(ctx context.Context, q querier, query string) (*sql.Stmt, error) {
	var st *sql.Stmt
	if v, ok := s.stmtCache.Load(query); ok {
		st = v.(*sql.Stmt)
	} else {
		p, err := s.db.PrepareContext(ctx, query)
		if err != nil {
			return nil, err
		}
		if v, loaded := s.stmtCache.LoadOrStore(query, p); loaded {
			p.Close()
			st = v.(*sql.Stmt)
		} else {
			st = p
		}
	}
	if tx, ok := q.(*sql.Tx); ok {
		return tx.StmtContext(ctx, st), nil // closed with the transaction
	}
	return st, nil
}

func (s *store) exec(ctx context.Context, q querier, query string, args ...any) (sql.Result, error) {
	s.stmts.Add(1)
	st, err := s.prepared(ctx, q, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (s *store) query(ctx context.Context, q querier, query string, args ...any) (*sql.Rows, error) {
	s.stmts.Add(1)
	st, err := s.prepared(ctx, q, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// row is a *sql.Row, or the error of preparing it.
type row struct {
	r   *sql.Row
	err error
}

func (r row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.r.Scan(dest...)
}

func (s *store) queryRow(ctx context.Context, q querier, query string, args ...any) row {
	s.stmts.Add(1)
	st, err := s.prepared(ctx, q, query)
	if err != nil {
		return row{err: err}
	}
	return row{r: st.QueryRowContext(ctx, args...)}
}

// InTx runs fn in a new transaction that holds the database's write lock
// from its start, and commits it when fn returns nil. It rolls back when fn
// returns an error (returned as it is) or panics (re-panicking). Inside fn
// pass tx to Claim, Complete, Fail and Release: a write on its own (a nil
// tx) on the same store waits for this transaction and fails after the busy
// timeout. Reads (Get, Stats,
// Pending) run concurrently on other connections and see the last commit.
//
// A failed COMMIT committed nothing (the driver rolls back what SQLite kept
// open). One refused by a deferred constraint is returned as that error,
// wrapped but not in [durable.ErrUnavailable]; a busy, I/O or closed-database
// failure at BEGIN or COMMIT is returned wrapped in [durable.ErrUnavailable],
// and callers written for the contract re-read with Get.
func (s *store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return s.runTx(ctx, s.locking, fn)
}

// runTx is InTx; lock says whether to take the write lock with a first
// statement (the transaction may start DEFERRED).
func (s *store) runTx(ctx context.Context, lock bool, fn func(ctx context.Context, tx *sql.Tx) error) error {
	unlock, err := s.lockWrites(ctx)
	if err != nil {
		return unavailable("begin", err)
	}
	defer unlock()
	s.stmts.Add(1)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return translate("begin", err)
	}
	done := false
	defer func() {
		if !done { // fn failed or panicked (the panic goes on after this)
			s.stmts.Add(1)
			_ = tx.Rollback()
		}
	}()
	if lock {
		// The transaction may have started DEFERRED (the caller's DSN): a
		// write that matches nothing takes the write lock now, so the
		// transaction can never fail later upgrading a read snapshot.
		if _, err := s.exec(ctx, tx, s.q.lock); err != nil {
			return translate("begin", err)
		}
	}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	done = true
	s.stmts.Add(1)
	if err := tx.Commit(); err != nil {
		if isUnavailable(err) {
			return unavailable("commit", err)
		}
		// Refused (a deferred foreign key violated): rolled back, definite.
		return fmt.Errorf("durable/sqlite: commit refused, transaction rolled back: %w", err)
	}
	return nil
}
