package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/internal/pgmigrate"
	"github.com/oncekey/oncekey/internal/storeapi"
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
	if d.url == "" {
		d.url = e.getenv("DATABASE_URL")
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
	cfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		return nil, usagef("bad database URL: %v", err)
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
