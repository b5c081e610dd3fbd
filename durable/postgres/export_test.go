package postgres

import (
	"context"
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
)

// MigrationsFor returns the migrations Migrate runs WithPartitions(n)
// (n = 0: the embedded files).
func MigrationsFor(n int) (fs.FS, error) { return migrationsFor(n) }

// Seed writes n records in a production-like mix into table on pool and
// runs ANALYZE (see seed).
func Seed(t testing.TB, pool *pgxpool.Pool, table string, n int) { seed(t, pool, table, n) }

// FullCountStats runs the statement Stats used before it read indexes: one
// sequential scan counting every record.
func FullCountStats(ctx context.Context, s durable.Store[pgx.Tx]) error {
	st := s.(*store)
	var v [10]int64
	return st.pool.QueryRow(ctx, st.q.statsExact).Scan(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9])
}
