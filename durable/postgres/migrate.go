package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
)

//go:embed migration/*.sql
var migrationFiles embed.FS

// Migrations returns the embedded migration files
// (001_create_idempotency_requests.up.sql and .down.sql), plain SQL that
// golang-migrate runs as they are, for a deployment that manages its schema
// with its own tool instead of [Migrate]. They use the default names
// (table idempotency_requests in the search_path's first schema), and create
// the table unpartitioned: for [WithPartitions], create the partitioned
// table and its partitions first (as Migrate does), and 001 then finds it.
// A contract step (007_digest_primary_key.contract.sql, see the package
// documentation) is not an up file: golang-migrate finds no up file for
// version 7 and records it without running anything (its down file does
// nothing until the step is applied). Run the contract file as it is,
// once every instance runs a version with 006.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migration")
	if err != nil {
		panic(err) // the embedded directory exists
	}
	return sub
}

// Migrate creates the schema (with [WithSchema]), the state type, the
// table and its indexes, and the table <table>_resolutions where the
// operator CLI (cmd/oncekey resolve) records each resolution, on pool, by
// running every embedded .up.sql file in order with the names opts
// configure (pass the options given to [New]), and records each applied
// version in the table <table>_migrations next to it
// (a database migrated before versions were recorded gets them recorded;
// the operator CLI, cmd/oncekey, reports them and rolls back one step). It
// is idempotent, and serialized by a transaction-scoped advisory lock
// (pg_advisory_xact_lock on the schema and table name), so any number of
// instances may call it at the same time at start-up: one creates, the
// others wait and find everything in place. It runs in one transaction: it
// applies entirely or not at all. With [WithPartitions] it creates the
// table hash-partitioned, and returns a an error matching [ErrConfig] for a
// table that exists with another partitioning. It returns an error
// wrapping [ErrConfig] for a nil pool or an invalid option.
//
// It holds no session state: the lock is released with its transaction, and
// the schema is set with SET LOCAL. So it needs no direct connection and
// runs through PgBouncer in transaction pooling mode as well, on a pool set
// up as the package documentation says ("PgBouncer"); on one that is not
// (pgx's default named prepared statements, ConfigurePool's startup
// parameters) it fails with an error matching [ErrConfig] that says what
// to change, having changed nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	if pool == nil {
		return fmt.Errorf("%w: Migrate: nil pool", ErrConfig)
	}
	c, err := newConfig(opts)
	if err != nil {
		return err
	}
	fsys, err := migrationsFor(c.partitions)
	if err != nil {
		return err
	}
	if _, err := pgmigrate.Up(ctx, pool, fsys, pgmigrate.Target{Schema: c.schema, Table: c.table}); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == partitionMismatchState {
			have, _ := strconv.Atoi(pgErr.Detail)
			table := c.table
			if c.schema != "" {
				table = c.schema + "." + table
			}
			return &partitionMismatchError{table: table, want: c.partitions, have: have}
		}
		return translate("migrate", err)
	}
	return nil
}

// partitionMismatchState is the SQLSTATE the partitioned 001 raises when
// the table exists with another partitioning; its DETAIL is the number of
// hash partitions the table has.
const partitionMismatchState = "OKP01"

// The file WithPartitions changes, and the statement in it that it makes
// partitioned.
const (
	createFile     = "001_create_idempotency_requests.up.sql"
	createTableSQL = "CREATE TABLE IF NOT EXISTS idempotency_requests ("
	partitionKey   = "tenant_id, operation, key_hash"
)

// migrationsFor returns the migrations Migrate runs: the embedded files,
// and with partitions > 0 the same files with 001 creating the table
// PARTITION BY HASH on its primary key with that many partitions, after a
// check that refuses a table that exists with another partitioning. Every
// later migration (ALTER TABLE, CREATE INDEX) applies to a partitioned
// table as it is: PostgreSQL carries it to the partitions.
func migrationsFor(partitions int) (fs.FS, error) {
	if partitions == 0 {
		return Migrations(), nil
	}
	files := fstest.MapFS{}
	err := fs.WalkDir(Migrations(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Migrations(), p)
		files[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		return nil, err
	}
	up, err := partitioned(string(files[createFile].Data), partitions)
	if err != nil {
		return nil, err
	}
	files[createFile] = &fstest.MapFile{Data: []byte(up)}
	return files, nil
}

// partitioned rewrites 001's up file (create) for n hash partitions.
func partitioned(create string, n int) (string, error) {
	start := strings.Index(create, createTableSQL)
	end := -1
	if start >= 0 {
		end = strings.Index(create[start:], "\n);\n")
	}
	if end < 0 {
		return "", fmt.Errorf("durable/postgres: migrate: %s has no %q ... \");\" to partition", createFile, createTableSQL)
	}
	end += start + len("\n)")
	ns := strconv.Itoa(n)
	var b strings.Builder
	b.WriteString(create[:start])
	b.WriteString(`-- WithPartitions(` + ns + `): a table that exists must be hash-partitioned on
-- its key into ` + ns + ` partitions; otherwise nothing changes.
DO $$
DECLARE
	key  text := pg_get_partkeydef(to_regclass('idempotency_requests'));
	have integer;
	good integer;
BEGIN
	IF to_regclass('idempotency_requests') IS NULL THEN
		RETURN;
	END IF;
	SELECT count(*), count(*) FILTER (WHERE pg_get_expr(c.relpartbound, c.oid) ~ '^FOR VALUES WITH \(modulus ` + ns + `, remainder [0-9]+\)$')
	INTO have, good
	FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	WHERE i.inhparent = to_regclass('idempotency_requests');
	IF key IS DISTINCT FROM 'HASH (` + partitionKey + `)' THEN
		have := 0;
	END IF;
	IF have <> ` + ns + ` OR good <> ` + ns + ` THEN
		RAISE EXCEPTION 'idempotency_requests has % hash partitions on its key, not ` + ns + `', have
			USING ERRCODE = '` + partitionMismatchState + `', DETAIL = have::text;
	END IF;
END
$$;

`)
	b.WriteString(create[start:end])
	b.WriteString(" PARTITION BY HASH (" + partitionKey + ")")
	b.WriteString(create[end : end+len(";\n")])
	for i := range n {
		fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS idempotency_requests_p%d PARTITION OF idempotency_requests\n\tFOR VALUES WITH (MODULUS %d, REMAINDER %d);\n", i, n, i)
	}
	b.WriteString(create[end+len(";\n"):])
	return b.String(), nil
}
