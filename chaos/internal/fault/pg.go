package fault

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BackendPID returns the PostgreSQL backend process of tx's connection, for
// [Terminate].
func BackendPID(ctx context.Context, tx pgx.Tx) (int32, error) {
	var pid int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return 0, fmt.Errorf("%w: pg_backend_pid: %w", ErrTerminate, err)
	}
	return pid, nil
}

// Terminate ends backend pid with pg_terminate_backend, from admin (a pool
// that is not the library's). The backend's open transaction is rolled
// back by the server and its client sees a lost connection at its next
// statement. It reports whether a backend was terminated.
func Terminate(ctx context.Context, admin *pgxpool.Pool, pid int32) (bool, error) {
	var ok bool
	if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil {
		return false, fmt.Errorf("%w: %w", ErrTerminate, err)
	}
	return ok, nil
}

// TerminateApp ends every backend whose application_name is app (set it in
// the library pool's runtime parameters), except admin's own. It returns
// how many it terminated.
func TerminateApp(ctx context.Context, admin *pgxpool.Pool, app string) (int, error) {
	var n int
	err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTerminate, err)
	}
	return n, nil
}
