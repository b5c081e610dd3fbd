package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/ncruces/go-sqlite3/driver" // registers the "sqlite3" database/sql driver

	"github.com/oncekey/oncekey/durable"
)

// DefaultTable is the table name used without [WithTable].
const DefaultTable = "idempotency_requests"

// DefaultBusyTimeout is how long a write waits for another writer without
// [WithBusyTimeout].
const DefaultBusyTimeout = 5 * time.Second

// maxConns bounds the connections Open keeps: one writer at a time plus
// concurrent readers (WAL lets them all run at once).
const maxConns = 8

// Compile-time check: Store implements the contract with *sql.Tx.
var _ durable.Store[*sql.Tx] = (*Store)(nil)

// Option configures [Open] and [New].
type Option func(*config)

type config struct {
	table       string
	secret      []byte
	busyTimeout time.Duration
}

// WithTable sets the table name. It must be a plain SQL identifier (letters,
// digits and '_', not starting with a digit nor with "sqlite_", at most 63
// bytes). Defaults to [DefaultTable].
func WithTable(name string) Option {
	return func(c *config) { c.table = name }
}

// WithKeySecret makes the store hash idempotency keys with
// HMAC-SHA-256(secret, key) instead of SHA-256, so a copy of the database
// file cannot be matched against guessed keys (see [durable.Scope.Ref]). The
// same secret must be used every time the file is opened. The slice is
// copied.
func WithKeySecret(secret []byte) Option {
	s := append([]byte(nil), secret...)
	return func(c *config) { c.secret = s }
}

// WithBusyTimeout sets how long a write waits for the database to be free:
// for another write of the same Store (an open [Store.InTx] holds the write
// lock until it ends) and, for a database opened by [Open], for another
// connection or process (SQLite's busy_timeout). After it, the write fails
// with [durable.ErrUnavailable]. At least 1ms; defaults to
// [DefaultBusyTimeout]. With [New] the driver's busy_timeout is the caller's
// to set in its DSN.
func WithBusyTimeout(d time.Duration) Option {
	return func(c *config) { c.busyTimeout = d }
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func newConfig(opts []Option) (config, error) {
	c := config{table: DefaultTable, busyTimeout: DefaultBusyTimeout}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if !identRE.MatchString(c.table) || strings.HasPrefix(strings.ToLower(c.table), "sqlite_") {
		return c, fmt.Errorf("%w: table name %q is not a plain identifier", ErrInvalidOption, c.table)
	}
	if c.busyTimeout < time.Millisecond {
		return c, fmt.Errorf("%w: busy timeout must be at least 1ms", ErrInvalidOption)
	}
	return c, nil
}

// Store is the SQLite implementation of [durable.Store] with *sql.Tx
// transactions. It is safe for concurrent use. Build it with [Open] or [New].
type Store struct {
	db      *sql.DB
	owned   bool // Open made db; Close closes it
	locking bool // transactions start deferred: take the write lock explicitly
	cfg     config
	wlock   chan struct{}
	stmts   atomic.Int64
	waiters atomic.Int64 // writes waiting in lockWrites
	q       queries
	// stmtCache maps a query to its *sql.Stmt.
	stmtCache sync.Map
}

// Open opens (creating it if needed) the SQLite database file at path and
// returns a Store on it. Call [Store.Migrate] before first use and
// [Store.Close] at the end.
//
// Every connection is configured with journal_mode=WAL (readers never block
// the writer), synchronous=FULL (a commit is on disk before it returns, so a
// completion survives a power loss, not only a process crash), a
// busy_timeout of the busy timeout, foreign_keys on, and BEGIN IMMEDIATE for
// write transactions (so a transaction takes the write lock at its start and
// never fails when upgrading a read lock). ctx bounds the first connection.
//
// path is a file name, not a URI: "", ":memory:" (each connection would see
// its own database) and names containing '?' are rejected with
// [ErrInvalidOption]. A file that cannot be opened returns
// [durable.ErrUnavailable]; one that cannot use WAL mode [ErrNoWAL].
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	switch {
	case path == "", path == ":memory:", strings.HasPrefix(path, "file:"), strings.ContainsAny(path, "?\x00"):
		return nil, fmt.Errorf("%w: path %q must be a plain file name", ErrInvalidOption, path)
	}
	dsn := fileURI(path, "_pragma="+fmt.Sprintf("busy_timeout(%d)", cfg.busyTimeout.Milliseconds())+
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_txlock=immediate")
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, translate("open", err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		db.Close()
		return nil, translate("open", err)
	}
	if !strings.EqualFold(mode, "wal") {
		db.Close()
		return nil, fmt.Errorf("%w: journal_mode is %q", ErrNoWAL, mode)
	}
	s := newStore(db, cfg)
	s.owned = true
	s.locking = false // _txlock=immediate
	return s, nil
}

// New returns a Store on a database the caller opened with the "sqlite3"
// driver (github.com/ncruces/go-sqlite3/driver, which this package imports). The caller keeps the *sql.DB: Close does not
// close it. Its DSN should set what [Open] sets
// ("_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)";
// "_txlock=immediate" is optional: [Store.InTx] takes the write lock with its
// first statement either way). New does not touch the database.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	s := newStore(db, cfg)
	s.locking = true
	return s, nil
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

func newStore(db *sql.DB, cfg config) *Store {
	return &Store{
		db:    db,
		cfg:   cfg,
		wlock: make(chan struct{}, 1),
		q:     buildQueries(cfg.table),
	}
}

// DB returns the underlying database, for the caller's own tables in the
// same file (a business write in the same transaction as the claim, with
// [Store.InTx]).
func (s *Store) DB() *sql.DB { return s.db }

// Table returns the table name the store uses.
func (s *Store) Table() string { return s.cfg.table }

// Close closes the database if [Open] opened it; with [New] it only
// releases the statements the Store prepared on the caller's database.
func (s *Store) Close() error {
	s.stmtCache.Range(func(k, v any) bool {
		s.stmtCache.Delete(k)
		v.(*sql.Stmt).Close()
		return true
	})
	if !s.owned {
		return nil
	}
	return s.db.Close()
}

// Statements returns how many SQL statements the store has run so far,
// counting BEGIN and COMMIT of the transactions it starts. Tests and
// benchmarks use it to check the documented statement counts.
func (s *Store) Statements() int64 { return s.stmts.Load() }

// WriteWaiters returns how many writes of this Store are waiting right now
// for another of its writes (an open [Store.InTx], say) to finish. A gauge
// for metrics; tests use it to know a claimer is blocked.
func (s *Store) WriteWaiters() int { return int(s.waiters.Load()) }

// Ref returns the stored identity of sc, hashing its key with the store's
// secret if [WithKeySecret] was given. It returns a *[durable.ScopeError]
// (matching [durable.ErrInvalidScope]) for an invalid scope.
func (s *Store) Ref(sc durable.Scope) (durable.Ref, error) {
	if err := sc.Validate(); err != nil {
		return durable.Ref{}, err
	}
	return sc.Ref(s.cfg.secret), nil
}

// lockWrites serializes the writes of this Store in the process, so that
// concurrent writers queue in Go instead of polling SQLite's busy handler.
// It waits at most the busy timeout, and no longer than ctx.
func (s *Store) lockWrites(ctx context.Context) (unlock func(), err error) {
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
		return nil, ErrWriteLockTimeout
	}
}

func (s *Store) unlockWrites() { <-s.wlock }

// querier is what *sql.DB and *sql.Tx have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// prepared returns the statement for query on q, prepared once per Store
// (database/sql prepares it again on each connection that runs it, once).
// Parsing a statement costs more than running it in SQLite.
func (s *Store) prepared(ctx context.Context, q querier, query string) (*sql.Stmt, error) {
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

func (s *Store) exec(ctx context.Context, q querier, query string, args ...any) (sql.Result, error) {
	s.stmts.Add(1)
	st, err := s.prepared(ctx, q, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (s *Store) query(ctx context.Context, q querier, query string, args ...any) (*sql.Rows, error) {
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

func (s *Store) queryRow(ctx context.Context, q querier, query string, args ...any) row {
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
// use the ...Tx methods with tx: a non-Tx write on the same Store waits for
// this transaction and fails after the busy timeout. Reads (Get, Stats,
// Pending) run concurrently on other connections and see the last commit.
//
// A failed COMMIT committed nothing (the driver rolls back what SQLite kept
// open). One refused by a deferred constraint is returned as that error,
// wrapped but not in [durable.ErrUnavailable]; a busy, I/O or closed-database
// failure at BEGIN or COMMIT is returned wrapped in [durable.ErrUnavailable],
// and callers written for the contract re-read with Get.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return s.runTx(ctx, s.locking, fn)
}

// runTx is InTx; lock says whether to take the write lock with a first
// statement (the transaction may start DEFERRED).
func (s *Store) runTx(ctx context.Context, lock bool, fn func(ctx context.Context, tx *sql.Tx) error) error {
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
