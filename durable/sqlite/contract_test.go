package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/sqlite"
	"github.com/oncekey/oncekey/testkit/storetest"
)

func TestContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		New: func(t testing.TB) storeapi.Store[*sql.Tx] { return open(t) },
		// A store on a closed *sql.DB: every call fails to reach it.
		Unreachable: func(t testing.TB) storeapi.Store[*sql.Tx] {
			s, err := sqlite.OpenStore(t.Context(), filepath.Join(t.TempDir(), "closed.db"))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return s
		},
		// In-process, SQLite reports the outcome of every COMMIT: there is
		// no acknowledgement to lose.
		Upgrade:       upgrade,
		LoseCommitAck: nil,
		// Not set: a Claim that replays a finished record is two in-process
		// statements here (the refused upsert, which writes nothing, then a
		// read), where the suite counts one network round trip each.
		// BenchmarkClaimComplete reports the counts as stmts/op.
		Statements:  nil,
		LockWaiters: func(s storeapi.Store[*sql.Tx]) int { return s.(*sqlite.Store).WriteWaiters() },
		// Its transactions begin IMMEDIATE: one open transaction holds the
		// database's write lock, and a write on its own waits for it.
		TxLocksDatabase: true,
		// A foreign key checked at COMMIT (foreign_keys is on), violated by
		// a row of the caller's own table.
		BreakCommit: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS durabletest_customers (id INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS durabletest_orders (customer INTEGER
	REFERENCES durabletest_customers (id) DEFERRABLE INITIALLY DEFERRED);
INSERT INTO durabletest_orders VALUES (42)`)
			return err
		},
	})
}
