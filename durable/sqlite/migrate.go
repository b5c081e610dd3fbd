package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed migration/*.sql
var migrationFiles embed.FS

// Migrations returns the embedded migration files (NNN_name.up.sql and
// NNN_name.down.sql, plain SQL that goose or golang-migrate can also run).
// They name the table [DefaultTable].
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migration")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return sub
}

// Migrate creates the table and its indexes if they do not exist, by running
// every embedded up migration in order in one write transaction (SQLite DDL
// is transactional: all or nothing). It is idempotent and safe to call
// from several goroutines or processes at once. ctx bounds it.
func (s *Store) Migrate(ctx context.Context) error {
	return s.migrate(ctx, ".up.sql")
}

// migrate runs the embedded files ending in suffix, in name order for up
// and in reverse for down, with the store's table name.
func (s *Store) migrate(ctx context.Context, suffix string) error {
	names, err := fs.Glob(migrationFiles, "migration/*"+suffix)
	if err != nil {
		return err
	}
	sort.Strings(names)
	if suffix == ".down.sql" {
		sort.Sort(sort.Reverse(sort.StringSlice(names)))
	}
	return s.runTx(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
		for _, name := range names {
			b, err := migrationFiles.ReadFile(name)
			if err != nil {
				return fmt.Errorf("durable/sqlite: migrate: %w", err)
			}
			// The table name is a validated identifier; index names are
			// derived from it the same way.
			stmt := strings.ReplaceAll(string(b), DefaultTable, s.cfg.table)
			if _, err := s.exec(ctx, tx, stmt); err != nil {
				return translate("migrate "+path.Base(name), err)
			}
		}
		return nil
	})
}
