// Package pgmigrate is the migration machinery of durable/postgres: it runs
// the numbered migration files (NNN_name.up.sql and NNN_name.down.sql) of
// that package on a schema and table, records the applied versions in the
// database, and rolls back one step. durable/postgres.Migrate runs [Up]; the
// operator CLI (cmd/oncekey) runs [Up], [Status], [Contract] and [Down].
//
// Versions are recorded in a table named after the store's table with the
// suffix "_migrations" (version, name, applied_at), in the same schema.
// Every up file is idempotent, so Up runs every one of them each time and
// records the versions it has not recorded yet: a database migrated before
// versions were recorded (no version table) gets its versions on its next
// Up, and a new numbered pair of files is applied and recorded by the next
// Up without any other change.
//
// A contract step (NNN_name.contract.sql with its .down.sql) is a change
// instances of an earlier version fail on: Up never runs it, [Contract]
// does, when the operator (cmd/oncekey migrate contract) knows every
// instance runs a version that works with it; Down rolls it back like any
// recorded version.
//
// Up, Contract and Down run in one transaction each, serialized by the same
// transaction-scoped advisory lock on the schema and table name that
// Migrate always took, so two deploys (or an old and a new instance) never
// race: one applies, the others wait and find everything in place.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package pgmigrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultTable is the table name the migration files are written with; it
// is replaced by the configured name.
const DefaultTable = "idempotency_requests"

// VersionSuffix is appended to the table name to name the version table.
const VersionSuffix = "_migrations"

// ErrNothingToRollBack is returned by [Down] when no version is recorded.
var ErrNothingToRollBack = errors.New("pgmigrate: no applied migration to roll back")

// ErrUnrecorded is returned by [Down] for a database migrated before
// versions were recorded: Up records them first.
var ErrUnrecorded = errors.New("pgmigrate: the table exists but no versions are recorded (migrated by an earlier version); run up first to record them")

// Migration is one numbered pair of files: NNN_name.up.sql, or for a
// contract step NNN_name.contract.sql, and NNN_name.down.sql.
type Migration struct {
	Version int
	Name    string // the base name without .up.sql, e.g. "001_create_idempotency_requests"
	// Contract marks a contract step: [Up] never runs it; [Contract] does,
	// once the operator knows no instance of a version before its expand
	// step runs any more.
	Contract bool
	up       string // file names in the FS (the .contract.sql file for a contract step)
	down     string
}

// Target names where the migrations apply. Schema empty means the
// search_path's current schema. Both must be validated identifiers (the
// store's options validate them): they are not quoted.
type Target struct {
	Schema string
	Table  string
}

func (t Target) versionTable() string { return t.qualify(t.Table + VersionSuffix) }

func (t Target) qualify(name string) string {
	if t.Schema == "" {
		return name
	}
	return t.Schema + "." + name
}

// List returns the migrations of fsys (files NNN_name.up.sql or
// NNN_name.contract.sql at its root, each with its .down.sql), in version
// order.
func List(fsys fs.FS) ([]Migration, error) {
	ups, err := fs.Glob(fsys, "*.up.sql")
	if err != nil {
		return nil, err
	}
	contracts, err := fs.Glob(fsys, "*.contract.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, up := range append(ups, contracts...) {
		ext := ".up.sql"
		if strings.HasSuffix(up, ".contract.sql") {
			ext = ".contract.sql"
		}
		base := strings.TrimSuffix(path.Base(up), ext)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("pgmigrate: %s: the name must start with a positive number and '_'", up)
		}
		down := strings.TrimSuffix(up, ext) + ".down.sql"
		if _, err := fs.Stat(fsys, down); err != nil {
			return nil, fmt.Errorf("pgmigrate: %s has no %s", up, down)
		}
		ms = append(ms, Migration{Version: v, Name: base, Contract: ext == ".contract.sql", up: up, down: down})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("pgmigrate: version %d twice (%s, %s)", ms[i].Version, ms[i-1].Name, ms[i].Name)
		}
	}
	return ms, nil
}

func (t Target) sql(fsys fs.FS, name string) (string, error) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(string(b), DefaultTable, t.Table), nil
}

// begin lists the migrations of fsys, opens the transaction, takes the
// advisory lock (the key Migrate has always used, so instances of earlier
// versions serialize with this one) and points search_path at the schema,
// creating it when create.
func begin(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, t Target, create bool) ([]Migration, pgx.Tx, error) {
	ms, err := List(fsys)
	if err != nil {
		return nil, nil, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("pgmigrate: begin: %w", err)
	}
	if _, err := tx.Exec(ctx,
		`SELECT pg_advisory_xact_lock(hashtextextended('oncekey/durable/postgres/migrate:' ||
			COALESCE(NULLIF($1::text, ''), current_schema(), '') || '.' || $2::text, 0))`,
		t.Schema, t.Table); err != nil {
		tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
		return nil, nil, fmt.Errorf("pgmigrate: lock: %w", err)
	}
	if t.Schema != "" {
		q := "SET LOCAL search_path TO " + t.Schema
		if create {
			q = "CREATE SCHEMA IF NOT EXISTS " + t.Schema + "; " + q
		}
		if _, err := tx.Exec(ctx, q); err != nil {
			tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
			return nil, nil, fmt.Errorf("pgmigrate: schema: %w", err)
		}
	}
	return ms, tx, nil
}

func createVersionTable(ctx context.Context, tx pgx.Tx, t Target) error {
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t.Table+VersionSuffix+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`)
	return err
}

// Up runs every migration's up file in order, in one transaction under the
// lock, and records the versions not recorded yet. It returns the versions
// it recorded (none when everything was in place).
func Up(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, t Target) ([]int, error) {
	ms, tx, err := begin(ctx, pool, fsys, t, true)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := createVersionTable(ctx, tx, t); err != nil {
		return nil, fmt.Errorf("pgmigrate: version table: %w", err)
	}
	var recorded []int
	for _, m := range ms {
		if m.Contract {
			continue // the operator's step: Contract
		}
		q, err := t.sql(fsys, m.up)
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("pgmigrate: %s: %w", path.Base(m.up), err)
		}
		tag, err := tx.Exec(ctx, `INSERT INTO `+t.Table+VersionSuffix+` (version, name) VALUES ($1, $2) ON CONFLICT (version) DO NOTHING`,
			m.Version, m.Name)
		if err != nil {
			return nil, fmt.Errorf("pgmigrate: record %s: %w", m.Name, err)
		}
		if tag.RowsAffected() == 1 {
			recorded = append(recorded, m.Version)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("pgmigrate: commit: %w", err)
	}
	return recorded, nil
}

// ErrNoContract is returned by [Contract] when the build has no contract
// step left to apply.
var ErrNoContract = errors.New("pgmigrate: no contract step to apply")

// Contract applies the lowest contract step not recorded yet: it runs its
// .contract.sql file and records its version, in one transaction under the
// lock, after checking that every migration below it is recorded (the
// expand steps it relies on). It returns the step applied, or
// [ErrNoContract].
func Contract(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, t Target) (Migration, error) {
	ms, tx, err := begin(ctx, pool, fsys, t, false)
	if err != nil {
		return Migration{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	vt, _, err := exists(ctx, tx, t)
	if err != nil {
		return Migration{}, err
	}
	if !vt {
		return Migration{}, fmt.Errorf("pgmigrate: contract: no versions are recorded: run up first")
	}
	got, err := versions(ctx, tx, t)
	if err != nil {
		return Migration{}, err
	}
	for _, m := range ms {
		switch _, done := got[m.Version]; {
		case done:
			continue
		case !m.Contract:
			return Migration{}, fmt.Errorf("pgmigrate: contract: %s is not applied: run up first", m.Name)
		}
		q, err := t.sql(fsys, m.up)
		if err != nil {
			return Migration{}, err
		}
		if _, err := tx.Exec(ctx, q); err != nil {
			return Migration{}, fmt.Errorf("pgmigrate: %s: %w", path.Base(m.up), err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+t.Table+VersionSuffix+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return Migration{}, fmt.Errorf("pgmigrate: record %s: %w", m.Name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return Migration{}, fmt.Errorf("pgmigrate: commit: %w", err)
		}
		return m, nil
	}
	return Migration{}, ErrNoContract
}

// Down rolls back the highest recorded version: it runs its down file and
// deletes its record, in one transaction under the lock. It returns the
// migration rolled back; [ErrNothingToRollBack] when none is recorded,
// [ErrUnrecorded] when the table exists without recorded versions.
func Down(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, t Target) (Migration, error) {
	ms, tx, err := begin(ctx, pool, fsys, t, false)
	if err != nil {
		return Migration{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	vt, table, err := exists(ctx, tx, t)
	if err != nil {
		return Migration{}, err
	}
	if !vt {
		if table {
			return Migration{}, ErrUnrecorded
		}
		return Migration{}, ErrNothingToRollBack
	}
	var v int
	var name string
	err = tx.QueryRow(ctx, `SELECT version, name FROM `+t.Table+VersionSuffix+` ORDER BY version DESC LIMIT 1`).Scan(&v, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		if table {
			return Migration{}, ErrUnrecorded
		}
		return Migration{}, ErrNothingToRollBack
	}
	if err != nil {
		return Migration{}, fmt.Errorf("pgmigrate: read versions: %w", err)
	}
	i := slices.IndexFunc(ms, func(m Migration) bool { return m.Version == v })
	if i < 0 {
		return Migration{}, fmt.Errorf("pgmigrate: version %d (%s) is recorded but this build has no such migration (a newer build applied it): roll back with that build", v, name)
	}
	q, err := t.sql(fsys, ms[i].down)
	if err != nil {
		return Migration{}, err
	}
	if _, err := tx.Exec(ctx, q); err != nil {
		return Migration{}, fmt.Errorf("pgmigrate: %s: %w", path.Base(ms[i].down), err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+t.Table+VersionSuffix+` WHERE version = $1`, v); err != nil {
		return Migration{}, fmt.Errorf("pgmigrate: unrecord %s: %w", name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Migration{}, fmt.Errorf("pgmigrate: commit: %w", err)
	}
	return ms[i], nil
}

// exists reports whether the version table and the store's table exist.
func exists(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, t Target) (versions, table bool, err error) {
	err = q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		t.versionTable(), t.qualify(t.Table)).Scan(&versions, &table)
	if err != nil {
		return false, false, fmt.Errorf("pgmigrate: look up tables: %w", err)
	}
	return versions, table, nil
}

// Applied is the state of one migration in [Status].
type Applied struct {
	Migration
	Applied   bool
	AppliedAt time.Time
}

// State is what [Status] reports.
type State struct {
	// Migrations are the migrations of this build, in order, each with
	// whether it is recorded as applied.
	Migrations []Applied
	// Unknown lists versions recorded in the database that this build does
	// not have (a newer build applied them).
	Unknown []int
	// Unrecorded reports a table that exists without a version table: a
	// database migrated before versions were recorded. Up records them.
	Unrecorded bool
}

// Status reads the recorded versions. It writes nothing and takes no lock.
func Status(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, t Target) (State, error) {
	ms, err := List(fsys)
	if err != nil {
		return State{}, err
	}
	vt, table, err := exists(ctx, pool, t)
	if err != nil {
		return State{}, err
	}
	st := State{Unrecorded: table && !vt}
	got := map[int]time.Time{}
	if vt {
		if got, err = versions(ctx, pool, t); err != nil {
			return State{}, err
		}
	}
	for _, m := range ms {
		at, ok := got[m.Version]
		st.Migrations = append(st.Migrations, Applied{Migration: m, Applied: ok, AppliedAt: at})
		delete(got, m.Version)
	}
	for v := range got {
		st.Unknown = append(st.Unknown, v)
	}
	slices.Sort(st.Unknown)
	return st, nil
}

// versions reads the recorded versions and when each was applied.
func versions(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, t Target) (map[int]time.Time, error) {
	rows, err := q.Query(ctx, `SELECT version, applied_at FROM `+t.versionTable())
	if err != nil {
		return nil, fmt.Errorf("pgmigrate: read versions: %w", err)
	}
	defer rows.Close()
	got := map[int]time.Time{}
	for rows.Next() {
		var v int
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			return nil, fmt.Errorf("pgmigrate: read versions: %w", err)
		}
		got[v] = at
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgmigrate: read versions: %w", err)
	}
	return got, nil
}
