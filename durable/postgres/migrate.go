package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migration/*.sql
var migrationFiles embed.FS

// Migrations returns the embedded migration files
// (001_create_idempotency_requests.up.sql and .down.sql), plain SQL that
// golang-migrate runs as they are, for a deployment that manages its schema
// with its own tool instead of [Migrate]. They use the default names
// (table idempotency_requests in the search_path's first schema).
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migration")
	if err != nil {
		panic(err) // the embedded directory exists
	}
	return sub
}

// Migrate creates the schema (with [WithSchema]), the state type, the
// table and its indexes on pool, by running every embedded .up.sql file in
// order with the names opts configure (pass the options given to [New]). It
// is idempotent, and serialized by a transaction-scoped advisory lock
// (pg_advisory_xact_lock on the schema and table name), so any number of
// instances may call it at the same time at start-up: one creates, the
// others wait and find everything in place. It runs in one transaction: it
// applies entirely or not at all. It returns an error wrapping [ErrConfig]
// for a nil pool or an invalid option.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	if pool == nil {
		return fmt.Errorf("%w: Migrate: nil pool", ErrConfig)
	}
	c, err := newConfig(opts)
	if err != nil {
		return err
	}
	names, err := fs.Glob(migrationFiles, "migration/*.up.sql")
	if err != nil {
		return fmt.Errorf("durable/postgres: migrate: %w", err)
	}
	slices.Sort(names)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return translate("migrate", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	// The lock key names the table as the instances see it: with no schema
	// option, the search_path's current schema.
	if _, err := tx.Exec(ctx,
		`SELECT pg_advisory_xact_lock(hashtextextended('oncekey/durable/postgres/migrate:' ||
			COALESCE(NULLIF($1::text, ''), current_schema(), '') || '.' || $2::text, 0))`,
		c.schema, c.table); err != nil {
		return translate("migrate: lock", err)
	}
	if c.schema != "" {
		// Identifiers were validated by WithSchema: no quoting needed.
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+c.schema+"; SET LOCAL search_path TO "+c.schema); err != nil {
			return translate("migrate: schema", err)
		}
	}
	for _, name := range names {
		b, err := migrationFiles.ReadFile(name)
		if err != nil {
			return fmt.Errorf("durable/postgres: migrate: %w", err)
		}
		sql := strings.ReplaceAll(string(b), defaultTable, c.table)
		if _, err := tx.Exec(ctx, sql); err != nil {
			return translate("migrate: "+path.Base(name), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return translate("migrate: commit", err)
	}
	return nil
}
