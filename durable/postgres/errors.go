package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/oncekey/oncekey/durable"
)

var (
	// ErrConfig is returned by [New], [Migrate] and [ConfigurePool] for an
	// invalid option or argument; the message names it. It is also matched
	// by the error of [CheckDurability], and of any operation, when the
	// pool cannot work behind the connection pooler in front of the
	// database (PgBouncer in transaction pooling mode): its message names
	// what does not work and what to change (see the package
	// documentation, "PgBouncer"). Retrying does not help.
	ErrConfig = errors.New("durable/postgres: invalid configuration")

	// ErrNotMigrated is matched by the error of a store's operation when the
	// database does not have the store's table as this version needs it: the
	// table or its schema does not exist (SQLSTATE 42P01, 3F000), or lacks a
	// column (42703), because [Migrate] has not run on it, or ran for
	// another [WithSchema] or [WithTable]. The cause stays visible with
	// errors.As (a *pgconn.PgError). Nothing was written; run `oncekey
	// migrate up` or [Migrate], with the store's options, and retry.
	ErrNotMigrated = errors.New("durable/postgres: the table is not migrated: run `oncekey migrate up` or postgres.Migrate with the store's schema and table")
)

// notMigratedStates are the SQLSTATEs of a statement of the store that
// names a table, schema or column the database does not have.
var notMigratedStates = map[string]bool{
	"42P01": true, // undefined_table
	"3F000": true, // invalid_schema_name
	"42703": true, // undefined_column: a table of an older schema version
}

// isNotMigrated reports whether err says the store's table (or its schema,
// or a column of it) does not exist.
func isNotMigrated(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && notMigratedStates[pgErr.Code]
}

// partitionMismatchError is returned by [Migrate] with [WithPartitions]
// when the table already exists with another partitioning: have is its
// number of hash partitions on (tenant_id, operation, key_hash), 0 when it
// is not partitioned that way. It matches [ErrConfig]. Migrate changed
// nothing. The partitioning of a table is chosen when it is created; to
// change it, create a new table (another [WithTable]) and move to it.
type partitionMismatchError struct {
	table      string // as the statements name it (schema-qualified with WithSchema)
	want, have int
}

func (e *partitionMismatchError) Error() string {
	have := "is not hash-partitioned on its key"
	if e.have > 0 {
		have = fmt.Sprintf("has %d hash partitions", e.have)
	}
	return fmt.Sprintf("durable/postgres: migrate: %v: table %s %s, WithPartitions asks for %d; the partitioning is chosen when the table is created",
		ErrConfig, e.table, have, e.want)
}

func (e *partitionMismatchError) Unwrap() error { return ErrConfig }

// poolerError reports a pool that cannot work behind the connection pooler
// in front of the database, PgBouncer in transaction pooling mode above
// all: it hands a server session to another client after each
// transaction, so nothing a client leaves in a session (named prepared
// statements, settings) stays with it. It matches [ErrConfig], and cause
// (the server's or the pooler's error, when there is one).
type poolerError struct {
	problem string // what does not work, and what to change
	cause   error
}

func (e *poolerError) Error() string {
	msg := fmt.Sprintf("%v: behind a connection pooler in transaction mode (PgBouncer pool_mode = transaction): %s", ErrConfig, e.problem)
	if e.cause != nil {
		msg += " (" + e.cause.Error() + ")"
	}
	return msg
}

func (e *poolerError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrConfig}
	}
	return []error{ErrConfig, e.cause}
}

// What a poolerError says for each problem.
const (
	namedStatementsProblem = "named prepared statements (pgx's default query exec mode, cache_statement) do not stay with the client's connection between transactions" +
		" (or a statement discarded them: DISCARD ALL, DEALLOCATE); set a query exec mode without named statements before pgxpool.NewWithConfig:" +
		" cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec (or QueryExecModeCacheDescribe), or default_query_exec_mode=exec in the connection string;" +
		" or run PgBouncer 1.21 or later with max_prepared_statements, or pool_mode = session"
	startupRefusedProblem = "the pooler refuses a startup parameter of the pool's connections (ConfigurePool's timeouts, or a parameter of the connection string such as search_path);" +
		" behind PgBouncer in transaction mode do not call ConfigurePool and give the connection string no parameters: set lock_timeout and" +
		" idle_in_transaction_session_timeout per role or database (ALTER ROLE ... SET), name the schema with WithSchema; the store bounds its own statements and transactions"
	startupDroppedProblem = "the pool's startup parameters %s never reach the server sessions (the pooler drops them: PgBouncer's ignore_startup_parameters)," +
		" so statements would wait for row locks, and transactions stay idle, without bound; do not call ConfigurePool behind PgBouncer and set them per role or" +
		" database (ALTER ROLE ... SET) instead: the store then bounds its own statements and transactions"
)

// poolerCause returns the poolerError err shows, or nil: a named prepared
// statement that another client's session already has (42P05) or that
// the session does not have (26000), which only pgx's statement cache
// names (the store names none), and a startup parameter PgBouncer refuses.
func poolerCause(err error) *poolerError {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil
	}
	switch {
	case (pgErr.Code == "42P05" || pgErr.Code == "26000") && strings.Contains(pgErr.Message, "prepared statement"):
		return &poolerError{problem: namedStatementsProblem, cause: err}
	case pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "unsupported startup parameter"):
		return &poolerError{problem: startupRefusedProblem, cause: err}
	}
	return nil
}

// SQLSTATEs that mean "the store cannot serve this now; retry", reported as
// durable.ErrUnavailable. Each is a definite failure: the statement did not
// apply.
var retryableStates = map[string]bool{
	"55P03": true,                                                             // lock_not_available: lock_timeout
	"57014": true,                                                             // query_canceled: statement_timeout or a cancel request
	"40001": true,                                                             // serialization_failure
	"40P01": true,                                                             // deadlock_detected
	"25P03": true,                                                             // idle_in_transaction_session_timeout
	"57P01": true,                                                             // admin_shutdown
	"57P02": true,                                                             // crash_shutdown
	"57P03": true,                                                             // cannot_connect_now
	"57P05": true,                                                             // idle_session_timeout
	"53300": true,                                                             // too_many_connections
	"53000": true,                                                             // insufficient_resources
	"53100": true,                                                             // disk_full
	"53200": true,                                                             // out_of_memory
	"08000": true, "08003": true, "08006": true, "08001": true, "08004": true, // connection exceptions
}

// unavailable wraps cause so that both errors.Is(err, durable.ErrUnavailable)
// and the cause are visible.
func unavailable(op string, cause error) error {
	return fmt.Errorf("durable/postgres: %s: %w: %w", op, durable.ErrUnavailable, cause)
}

// isUnavailable reports whether err means the database could not be reached
// or could not serve the statement now (see retryableStates).
func isUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return retryableStates[pgErr.Code]
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	switch {
	case errors.Is(err, puddle.ErrClosedPool),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.As(err, &netErr), errors.As(err, &connectErr),
		pgconn.Timeout(err), pgconn.SafeToRetry(err):
		return true
	}
	return false
}

// isAmbiguous reports whether a failed write may nevertheless have been
// applied: the database could not be reached, the error did not come from
// the server, and the request may have been sent.
func isAmbiguous(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false // the server answered: the statement did not apply
	}
	if errors.Is(err, puddle.ErrClosedPool) || pgconn.SafeToRetry(err) {
		return false // nothing was sent
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return false
	}
	return isUnavailable(err)
}

// translate maps a backend error to the contract's errors at the boundary.
func translate(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("durable/postgres: %s: %w", op, durable.ErrNotFound)
	case poolerCause(err) != nil:
		return fmt.Errorf("durable/postgres: %s: %w", op, poolerCause(err))
	case isUnavailable(err):
		return unavailable(op, err)
	case isNotMigrated(err):
		return fmt.Errorf("%w: %s: %w", ErrNotMigrated, op, err)
	}
	return fmt.Errorf("durable/postgres: %s: %w", op, err)
}
