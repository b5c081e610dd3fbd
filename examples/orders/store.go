package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Order is one order, as the service stores and returns it.
type Order struct {
	ID       string `json:"id"`
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// orderStore is the service's own table, on one backend. TTx is the
// transaction type of the durable store (pgx.Tx for PostgreSQL, *sql.Tx for
// SQLite): insert runs in the transaction that holds the claim, so the
// order and the stored response commit together.
//
// op is the operation identity (claimhttp.OperationID), kept with the row
// to trace an order back to the request that created it.
type orderStore[TTx any] interface {
	insert(ctx context.Context, tx TTx, tenant, op string, o Order) error
	// get returns errNotFound when the tenant has no such order.
	get(ctx context.Context, tenant, id string) (Order, error)
	list(ctx context.Context, tenant string) ([]Order, error)
}

// pgOrders is the table in PostgreSQL.
type pgOrders struct{ pool *pgxpool.Pool }

var _ orderStore[pgx.Tx] = pgOrders{}

const pgOrdersSchema = `
CREATE TABLE IF NOT EXISTS example_orders (
	id         text        PRIMARY KEY,
	tenant     text        NOT NULL,
	op         text        NOT NULL,
	item       text        NOT NULL,
	quantity   integer     NOT NULL CHECK (quantity > 0),
	created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS example_orders_tenant ON example_orders (tenant, created_at)`

// newPGOrders creates the table if needed.
func newPGOrders(ctx context.Context, pool *pgxpool.Pool) (pgOrders, error) {
	if _, err := pool.Exec(ctx, pgOrdersSchema); err != nil {
		return pgOrders{}, fmt.Errorf("orders: create table: %w", err)
	}
	return pgOrders{pool: pool}, nil
}

func (s pgOrders) insert(ctx context.Context, tx pgx.Tx, tenant, op string, o Order) error {
	_, err := tx.Exec(ctx, `INSERT INTO example_orders (id, tenant, op, item, quantity) VALUES ($1, $2, $3, $4, $5)`,
		o.ID, tenant, op, o.Item, o.Quantity)
	return err
}

func (s pgOrders) get(ctx context.Context, tenant, id string) (Order, error) {
	o := Order{ID: id}
	err := s.pool.QueryRow(ctx, `SELECT item, quantity FROM example_orders WHERE tenant = $1 AND id = $2`,
		tenant, id).Scan(&o.Item, &o.Quantity)
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, errNotFound
	}
	return o, err
}

func (s pgOrders) list(ctx context.Context, tenant string) ([]Order, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, item, quantity FROM example_orders WHERE tenant = $1 ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Order, error) {
		var o Order
		err := row.Scan(&o.ID, &o.Item, &o.Quantity)
		return o, err
	})
}

// sqliteOrders is the table in the embedded SQLite file, next to the
// idempotency records.
type sqliteOrders struct{ db *sql.DB }

var _ orderStore[*sql.Tx] = sqliteOrders{}

const sqliteOrdersSchema = `
CREATE TABLE IF NOT EXISTS example_orders (
	id         TEXT    PRIMARY KEY,
	tenant     TEXT    NOT NULL,
	op         TEXT    NOT NULL,
	item       TEXT    NOT NULL,
	quantity   INTEGER NOT NULL CHECK (quantity > 0),
	created_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
) STRICT;
CREATE INDEX IF NOT EXISTS example_orders_tenant ON example_orders (tenant, created_at)`

// newSQLiteOrders creates the table if needed.
func newSQLiteOrders(ctx context.Context, db *sql.DB) (sqliteOrders, error) {
	if _, err := db.ExecContext(ctx, sqliteOrdersSchema); err != nil {
		return sqliteOrders{}, fmt.Errorf("orders: create table: %w", err)
	}
	return sqliteOrders{db: db}, nil
}

func (s sqliteOrders) insert(ctx context.Context, tx *sql.Tx, tenant, op string, o Order) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO example_orders (id, tenant, op, item, quantity) VALUES (?, ?, ?, ?, ?)`,
		o.ID, tenant, op, o.Item, o.Quantity)
	return err
}

func (s sqliteOrders) get(ctx context.Context, tenant, id string) (Order, error) {
	o := Order{ID: id}
	err := s.db.QueryRowContext(ctx, `SELECT item, quantity FROM example_orders WHERE tenant = ? AND id = ?`,
		tenant, id).Scan(&o.Item, &o.Quantity)
	if errors.Is(err, sql.ErrNoRows) {
		return Order{}, errNotFound
	}
	return o, err
}

func (s sqliteOrders) list(ctx context.Context, tenant string) ([]Order, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, item, quantity FROM example_orders WHERE tenant = ? ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Order
	for rows.Next() {
		var o Order
		if err := rows.Scan(&o.ID, &o.Item, &o.Quantity); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}
