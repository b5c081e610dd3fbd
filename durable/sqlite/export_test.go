package sqlite

import (
	"context"
	"database/sql"
)

// Store is, in tests only, a store with the handles its tests use: the
// statement and write-waiter counters, the database, Migrate and Close.
type Store struct {
	*store
	opts  []Option
	owned bool // OpenStore opened the database: Close closes it
}

// OpenStore opens path with [Open] and returns a store on it with [New]
// (not migrated).
func OpenStore(ctx context.Context, path string, opts ...Option) (*Store, error) {
	db, err := Open(path, opts...)
	if err != nil {
		return nil, err
	}
	st, err := New(db, opts...)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Store{store: st.(*store), opts: opts, owned: true}, nil
}

// Migrate runs [Migrate] on the store's database with its options.
func (s *Store) Migrate(ctx context.Context) error { return Migrate(ctx, s.db, s.opts...) }

// Close closes the prepared statements, and the database if OpenStore
// opened it.
func (s *Store) Close() error {
	s.closeStmts()
	if !s.owned {
		return nil
	}
	return s.db.Close()
}

func (s *Store) DB() *sql.DB       { return s.db }
func (s *Store) Table() string     { return s.cfg.table }
func (s *Store) Statements() int64 { return s.stmts.Load() }
func (s *Store) WriteWaiters() int { return int(s.waiters.Load()) }
