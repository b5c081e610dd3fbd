package main

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/examples/internal/backend"
)

// queue is River on the durable store's own database, so that a claim and
// its job commit in one transaction.
type queue[TTx any] struct {
	store  durable.Store[TTx]
	driver riverdriver.Driver[TTx]
}

func postgresRiver(b *backend.Backend) queue[pgx.Tx] {
	return queue[pgx.Tx]{store: b.Postgres, driver: riverpgxv5.New(b.Pool)}
}

func sqliteRiver(b *backend.Backend) queue[*sql.Tx] {
	return queue[*sql.Tx]{store: b.SQLite, driver: riversqlite.New(b.DB)}
}

// migrate creates River's tables (idempotent).
func (q queue[TTx]) migrate(ctx context.Context) error {
	m, err := rivermigrate.New(q.driver, nil)
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}
