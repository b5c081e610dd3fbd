package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/ncruces/go-sqlite3"

	"github.com/oncekey/oncekey/durable"
)

var (
	// ErrConfig is returned by [Open], [New] and [Migrate] for an invalid
	// option, path or argument, and by Migrate for a database from [Open]
	// that cannot be put in WAL mode (for example on a file system without
	// shared memory, where the concurrency the package documents would not
	// hold); the message names it.
	ErrConfig = errors.New("durable/sqlite: invalid configuration")

	// errWriteLockTimeout is returned, wrapped together with
	// [durable.ErrUnavailable] (which is what callers match, as for
	// PostgreSQL's lock_timeout), when a write waited longer than the busy
	// timeout for another write of the same store to finish (a long InTx,
	// or a write made from inside one on its own, with a nil tx, instead of
	// with the transaction).
	errWriteLockTimeout = errors.New("durable/sqlite: timed out waiting for the write lock")
)

// unavailable wraps cause in durable.ErrUnavailable, keeping both visible to
// errors.Is.
func unavailable(op string, cause error) error {
	return fmt.Errorf("durable/sqlite: %s: %w: %w", op, durable.ErrUnavailable, cause)
}

// translate turns an error from database/sql or the driver into the
// contract's vocabulary: failures to reach or use the database file
// (closed DB, cannot open, I/O, locked past the busy timeout, cancelled or
// expired context) wrap durable.ErrUnavailable; sql.ErrNoRows becomes
// durable.ErrNotFound; anything else (a missing table, a constraint) is a
// bug or a missing migration and is wrapped as it is.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("durable/sqlite: %s: %w", op, durable.ErrNotFound)
	}
	if isUnavailable(err) {
		return unavailable(op, err)
	}
	return fmt.Errorf("durable/sqlite: %s: %w", op, err)
}

func isUnavailable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, sql.ErrConnDone) || errors.Is(err, sql.ErrTxDone) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, errWriteLockTimeout) {
		return true
	}
	// The driver reports a *sqlite3.Error or a bare sqlite3.ErrorCode; As
	// yields the primary result code of either.
	var code sqlite3.ErrorCode
	if errors.As(err, &code) {
		switch code {
		case sqlite3.BUSY, sqlite3.LOCKED, sqlite3.CANTOPEN,
			sqlite3.IOERR, sqlite3.FULL, sqlite3.NOMEM,
			sqlite3.INTERRUPT, sqlite3.PROTOCOL, sqlite3.READONLY,
			sqlite3.PERM, sqlite3.NOTADB, sqlite3.CORRUPT,
			sqlite3.NOLFS, sqlite3.AUTH:
			return true
		}
		return false
	}
	// database/sql reports a closed *sql.DB with an unexported error value.
	return strings.Contains(err.Error(), "sql: database is closed")
}
