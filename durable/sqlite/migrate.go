package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ncruces/go-sqlite3"
)

//go:embed migration/*.sql
var migrationFiles embed.FS

// Migrations returns the embedded migration files (NNN_name.up.sql and
// NNN_name.down.sql, plain SQL that goose or golang-migrate can also run).
// They name the table "idempotency_requests".
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migration")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return sub
}

// migrationTable records, per store table, the migration versions
// [Migrate] applied, so that each runs once (a SQLite ALTER TABLE
// cannot be written to run twice).
const migrationTable = "oncekey_migration"

// Migrate brings the table and its indexes on db to the latest version by
// running every embedded up migration not applied yet, in order, in one
// write transaction (SQLite DDL is transactional: all or nothing), with the
// names opts configure (pass the options given to [New]). It records the
// versions it applied in table oncekey_migration, keyed by the table name.
// A database migrated by an earlier release (which did not record versions)
// is brought up to date: migration 001 is idempotent and runs again as a
// no-op. It is safe to call from several goroutines or processes at once.
// ctx bounds it.
//
// For a database from [Open] it first checks that the file is in WAL mode
// (an error wrapping [ErrConfig] otherwise: the concurrency the package
// documents would not hold). A file that cannot be opened returns
// [durable.ErrUnavailable]; a nil db or an invalid option an error wrapping
// [ErrConfig].
func Migrate(ctx context.Context, db *sql.DB, opts ...Option) error {
	if db == nil {
		return fmt.Errorf("%w: Migrate: nil *sql.DB", ErrConfig)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	// A connection opened while another is switching a fresh file to WAL
	// (another pool, or this one's, migrating the same file) can fail
	// its journal_mode pragma with SQLITE_BUSY without the busy handler
	// ever running. Migrate is idempotent and serialized by its own write
	// transaction, so such a lock is retried, within the busy timeout.
	deadline := time.Now().Add(max(cfg.busyTimeout, time.Second))
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		err := migrateOnce(ctx, db, cfg)
		if err == nil || !lockedAtOpen(err) || time.Now().Add(wait).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// lockedAtOpen reports whether err is SQLITE_BUSY or SQLITE_LOCKED.
func lockedAtOpen(err error) bool {
	var code sqlite3.ErrorCode
	return errors.As(err, &code) && (code == sqlite3.BUSY || code == sqlite3.LOCKED)
}

// migrateOnce is one attempt of Migrate.
func migrateOnce(ctx context.Context, db *sql.DB, cfg config) error {
	if openedByOpen(db) {
		var mode string
		if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
			return translate("migrate", err)
		}
		if !strings.EqualFold(mode, "wal") {
			return fmt.Errorf("%w: WAL journal mode unavailable: journal_mode is %q", ErrConfig, mode)
		}
	}
	s := newStore(db, cfg)
	defer s.closeStmts()
	return s.migrate(ctx, ".up.sql")
}

// migrate runs the embedded files ending in suffix, with the store's table
// name: for up, those not recorded yet, in name order; for down, those
// recorded, in reverse.
func (s *store) migrate(ctx context.Context, suffix string) error {
	names, err := fs.Glob(migrationFiles, "migration/*"+suffix)
	if err != nil {
		return err
	}
	sort.Strings(names)
	up := suffix == ".up.sql"
	if !up {
		sort.Sort(sort.Reverse(sort.StringSlice(names)))
	}
	return s.runTx(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
		// The first statement writes, so the transaction holds the write
		// lock before it reads which versions are applied.
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+migrationTable+` (
	table_name TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	applied_at INTEGER NOT NULL,
	PRIMARY KEY (table_name, version)
) STRICT, WITHOUT ROWID;
UPDATE `+migrationTable+` SET version = version WHERE 0`); err != nil {
			return translate("migrate", err)
		}
		for _, name := range names {
			base := path.Base(name)
			version, err := strconv.Atoi(base[:strings.IndexByte(base, '_')])
			if err != nil {
				return fmt.Errorf("durable/sqlite: migrate: %s: %w", base, err)
			}
			var applied bool
			if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+migrationTable+
				` WHERE table_name = ?1 AND version = ?2)`, s.cfg.table, version).Scan(&applied); err != nil {
				return translate("migrate", err)
			}
			// Earlier releases applied 001 without recording it; it is
			// idempotent, so it runs again (a no-op) and is recorded.
			if applied == up {
				continue
			}
			b, err := migrationFiles.ReadFile(name)
			if err != nil {
				return fmt.Errorf("durable/sqlite: migrate: %w", err)
			}
			// The table name is a validated identifier; index names are
			// derived from it the same way.
			stmt := strings.ReplaceAll(string(b), defaultTable, s.cfg.table)
			// Not prepared on the pool (s.exec): another connection would
			// not see the tables this transaction created yet.
			s.stmts.Add(1)
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return translate("migrate "+base, err)
			}
			if up && version == operationDigestVersion {
				if err := s.backfillOperationDigests(ctx, tx); err != nil {
					return translate("migrate "+base, err)
				}
			}
			record := `DELETE FROM ` + migrationTable + ` WHERE table_name = ?1 AND version = ?2`
			if up {
				record = `INSERT INTO ` + migrationTable + ` (table_name, version, applied_at)
VALUES (?1, ?2, ` + now + `)`
			}
			if _, err := tx.ExecContext(ctx, record, s.cfg.table, version); err != nil {
				return translate("migrate "+base, err)
			}
		}
		return nil
	})
}
