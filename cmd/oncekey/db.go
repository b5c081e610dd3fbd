package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
)

// dbFlags are the flags every database subcommand has.
type dbFlags struct {
	url     string
	schema  string
	table   string
	timeout time.Duration
}

func (d *dbFlags) register(fs *flag.FlagSet, timeout time.Duration) {
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
	fs.StringVar(&d.schema, "schema", "", "schema of the table, as postgres.WithSchema (default: the search_path's)")
	fs.StringVar(&d.table, "table", pgmigrate.DefaultTable, "table name, as postgres.WithTable")
	fs.DurationVar(&d.timeout, "timeout", timeout, "bound on the whole command")
}

func (d *dbFlags) options() []postgres.Option {
	opts := []postgres.Option{postgres.WithTable(d.table)}
	if d.schema != "" {
		opts = append(opts, postgres.WithSchema(d.schema))
	}
	return opts
}

func (d *dbFlags) target() pgmigrate.Target {
	return pgmigrate.Target{Schema: d.schema, Table: d.table}
}

// db is an open connection to the store.
type db struct {
	pool  *pgxpool.Pool
	store storeapi.Store[pgx.Tx]
	ctx   context.Context
	stop  context.CancelFunc
}

func (b *db) Close() {
	b.pool.Close()
	b.stop()
}

// open validates the flags, connects (checking that the server answers)
// and returns the library's store on the pool. secret, when non-empty, is
// the store's key secret.
func (d *dbFlags) open(e *env, secret []byte) (*db, error) {
	source := "-database-url"
	if d.url == "" {
		d.url, source = e.getenv("DATABASE_URL"), "DATABASE_URL"
	}
	if d.url == "" {
		return nil, usagef("no database: set -database-url or DATABASE_URL")
	}
	if d.timeout <= 0 {
		return nil, usagef("-timeout must be positive")
	}
	opts := d.options()
	if len(secret) > 0 {
		opts = append(opts, postgres.WithKeySecret(secret))
	}
	cfg, err := parseDatabaseURL(d.url, source)
	if err != nil {
		return nil, err
	}
	if err := postgres.ConfigurePool(cfg, opts...); err != nil {
		return nil, usagef("%v", err)
	}
	cfg.MaxConns = 4
	ctx, stop := context.WithTimeout(e.ctx, d.timeout)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		stop()
		return nil, fmt.Errorf("database: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		stop()
		return nil, fmt.Errorf("database unreachable (%s:%d): %v", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	st, err := postgres.New(pool, opts...)
	if err != nil {
		pool.Close()
		stop()
		return nil, usagef("%v", err)
	}
	full, ok := st.(storeapi.Store[pgx.Tx])
	if !ok {
		pool.Close()
		stop()
		return nil, errors.New("internal: the store lacks the claim protocol")
	}
	return &db{pool: pool, store: full, ctx: ctx, stop: stop}, nil
}

// storeErr gives a store error the operator's words.
func storeErr(what string, err error) error {
	switch {
	case errors.Is(err, durable.ErrUnavailable):
		return fmt.Errorf("%s: database unavailable: %w", what, err)
	case errors.Is(err, durable.ErrNotFound):
		return fmt.Errorf("%s: no such operation", what)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func contextTimeout(e *env, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		d = time.Minute
	}
	return context.WithTimeout(e.ctx, d)
}

// percentEncode is the hint every bad URL gets: a password with one of
// these characters unencoded is the usual cause, and the message cannot
// show the URL to point at it.
const percentEncode = "check that special characters in the password are percent-encoded: @ as %40, / as %2F, ? as %3F, # as %23, % as %25"

// urlProblem names what is wrong with a URL, or ""
// when nothing is found. It never quotes the URL, nor the error of
// net/url, which can hold part of a password: only fixed words.
func urlProblem(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "invalid port"):
			return "invalid port"
		case strings.Contains(msg, "missing protocol scheme"), strings.Contains(msg, "first path segment in URL cannot contain colon"):
			return "not a URL (no scheme://)"
		case strings.Contains(msg, "invalid userinfo"):
			return "invalid character in the user or password"
		case strings.Contains(msg, "invalid character"), strings.Contains(msg, "invalid control character"):
			return "invalid character"
		case strings.Contains(msg, "invalid URL escape"):
			return "invalid percent-encoding"
		}
		return "cannot be parsed"
	}
	// A '#' ends the URL's part a server reads: in a password, the rest
	// of the URL became a fragment, and the host what followed an '@'
	// before it (a name the error of the connection would show).
	if strings.Contains(raw, "#") {
		return "a '#' in the URL"
	}
	// An '@' the parser did not take as the end of user:password: the
	// password held a '/' or '?', and its rest became the path or query.
	if u.User == nil && strings.Contains(raw, "@") || strings.Contains(u.Path+u.RawQuery, "@") {
		return "an '@' after the host"
	}
	// More than one '@' before the host: net/url ends user:password at
	// the last, pgx at the first, and the rest of the password becomes
	// the host its connection error shows.
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		authority, _, _ := strings.Cut(rest, "/")
		authority, _, _ = strings.Cut(authority, "?")
		if strings.Count(authority, "@") > 1 {
			return "more than one '@' before the host"
		}
	}
	return ""
}

// parseDatabaseURL parses the database URL (a postgres:// URL or a
// key=value string) for pgx. Its errors name source (-database-url or
// DATABASE_URL) and the part that failed, never the URL nor pgx's parse
// error: both can hold the password.
func parseDatabaseURL(raw, source string) (*pgxpool.Config, error) {
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		if p := urlProblem(raw); p != "" {
			return nil, usagef("%s: %s (%s)", source, p, percentEncode)
		}
	}
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, usagef("%s: cannot be parsed (%s; and that every parameter is one pgx knows)", source, percentEncode)
	}
	return cfg, nil
}

// migrateHint is the command that creates what d names: migrate up with
// the same -schema and -table.
func migrateHint(d dbFlags) string {
	s := "oncekey migrate up"
	if d.schema != "" {
		s += " -schema " + d.schema
	}
	if d.table != pgmigrate.DefaultTable {
		s += " -table " + d.table
	}
	return s + " (with the same database)"
}

// openTables opens the database as open does and checks its tables as
// requireTables does (with resolutions: the resolutions table too).
func (d *dbFlags) openTables(e *env, secret []byte, resolutions bool) (*db, error) {
	b, err := d.open(e, secret)
	if err != nil {
		return nil, err
	}
	if err := b.requireTables(*d, resolutions); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// requireTables fails, saying which table is missing and the command that
// creates it, unless the store's table exists, and with resolutions its
// resolutions table (migration 005) too. Without it, every command
// answered a bare 'relation "idempotency_requests" does not exist'. It
// reads the catalog only.
func (b *db) requireTables(d dbFlags, resolutions bool) error {
	names := []string{d.table}
	if resolutions {
		names = append(names, d.table+resolutionsSuffix)
	}
	for _, n := range names {
		var exists bool
		var schema string
		err := b.pool.QueryRow(b.ctx, `SELECT to_regclass($1) IS NOT NULL, COALESCE(NULLIF($2::text, ''), current_schema(), '')`,
			qualify(d.schema, n), d.schema).Scan(&exists, &schema)
		if err != nil {
			return storeErr("look up the table", err)
		}
		if exists {
			continue
		}
		if n != d.table {
			return fmt.Errorf("the table %s does not exist: it records resolve's reasons (migration 005, newer than this schema's); run %s", qualify(schema, n), migrateHint(d))
		}
		return fmt.Errorf("the table %s does not exist: this schema is not migrated; run %s", qualify(schema, n), migrateHint(d))
	}
	return nil
}

// qualify prefixes name with schema, when there is one.
func qualify(schema, name string) string {
	if schema == "" {
		return name
	}
	return schema + "." + name
}
