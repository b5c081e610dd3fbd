package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	sqlite3 "modernc.org/sqlite"
	sqlitelib "modernc.org/sqlite/lib"

	"github.com/oncekey/oncekey/durable"
)

var (
	// ErrConfig is returned by [Open], [New] and [Migrate] for an invalid
	// option, path or argument; the message names it.
	ErrConfig = errors.New("durable/sqlite: invalid configuration")

	// ErrWriteLockTimeout is returned, wrapped together with
	// [durable.ErrUnavailable], when a write waited longer than the busy
	// timeout for another write of the same store to finish (a long InTx,
	// or a write made from inside one on its own, with a nil tx, instead of
	// with the transaction).
	ErrWriteLockTimeout = errors.New("durable/sqlite: timed out waiting for the write lock")

	// ErrNoWAL is returned by [Migrate] when a database from [Open] cannot be put in
	// WAL mode (for example on a file system without shared memory), so the
	// concurrency the package documents would not hold.
	ErrNoWAL = errors.New("durable/sqlite: WAL journal mode unavailable")
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
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, ErrWriteLockTimeout) {
		return true
	}
	var se *sqlite3.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff { // the primary result code of an extended one
		case sqlitelib.SQLITE_BUSY, sqlitelib.SQLITE_LOCKED, sqlitelib.SQLITE_CANTOPEN,
			sqlitelib.SQLITE_IOERR, sqlitelib.SQLITE_FULL, sqlitelib.SQLITE_NOMEM,
			sqlitelib.SQLITE_INTERRUPT, sqlitelib.SQLITE_PROTOCOL, sqlitelib.SQLITE_READONLY,
			sqlitelib.SQLITE_PERM, sqlitelib.SQLITE_NOTADB, sqlitelib.SQLITE_CORRUPT,
			sqlitelib.SQLITE_NOLFS, sqlitelib.SQLITE_AUTH:
			return true
		}
		return false
	}
	// database/sql reports a closed *sql.DB with an unexported error value.
	return strings.Contains(err.Error(), "sql: database is closed")
}
