package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/internal/pgmigrate"
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
// order with the names opts configure (pass the options given to [New]), and
// records each applied version in the table <table>_migrations next to it
// (a database migrated before versions were recorded gets them recorded;
// the operator CLI, cmd/oncekey, reports them and rolls back one step). It
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
	if _, err := pgmigrate.Up(ctx, pool, Migrations(), pgmigrate.Target{Schema: c.schema, Table: c.table}); err != nil {
		return translate("migrate", err)
	}
	return nil
}
