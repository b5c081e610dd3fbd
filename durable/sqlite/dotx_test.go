package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/sqlite"
)

// (claim's DoTx on this store; it lives here because durable/sqlite is a
// module of its own, which the library's module must not require.)

var errRolledBack = errors.New("the caller rolled back")

func dotxReq(key, fp string) claim.Request {
	return claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: key}, Fingerprint: fp}
}

func dotxResult(body string) durable.Result {
	return durable.Result{StatusCode: 201, Body: []byte(body)}
}

// DoTx on SQLite: the same commit and rollback, on the caller's *sql.Tx.
func TestClaimer_DoTxSQLite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "oncekey.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlite.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.New(db)
	if err != nil {
		t.Fatal(err)
	}
	c, err := claim.New[*sql.Tx](st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (op TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	insert := func(ctx context.Context, tx *sql.Tx, op claim.Op) (durable.Result, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES (?)`, op.ID); err != nil {
			return durable.Result{}, err
		}
		return dotxResult(`{"order":"` + op.ID + `"}`), nil
	}
	count := func(op string) int {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE op = ?`, op).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	run := func(key string, commit bool) claim.Outcome {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		out, finish, err := c.DoTx(ctx, tx, dotxReq(key, "v1:a"), insert)
		if err != nil {
			_ = tx.Rollback()
			t.Fatalf("DoTx: %v", err)
		}
		if commit {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
			err = errRolledBack
		}
		finish(ctx, err)
		return out
	}

	out := run("s-commit", true)
	if out.Kind != claim.Executed || count(out.OperationID) != 1 {
		t.Fatalf("commit: %v, %d orders", out.Kind, count(out.OperationID))
	}
	if rep := run("s-commit", true); rep.Kind != claim.Replayed || string(rep.Result.Body) != string(out.Result.Body) || count(out.OperationID) != 1 {
		t.Fatalf("retry after commit: %v", rep.Kind)
	}

	out = run("s-rollback", false)
	if out.Kind != claim.Executed {
		t.Fatalf("rollback: %v", out.Kind)
	}
	if _, err := c.Operation(ctx, "acme", out.OperationID); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("after rollback: %v; want no record", err)
	}
	if count(out.OperationID) != 0 {
		t.Fatal("the rolled-back order is there")
	}
	if again := run("s-rollback", true); again.Kind != claim.Executed || count(out.OperationID) != 1 {
		t.Fatalf("retry after rollback: %v, %d orders", again.Kind, count(out.OperationID))
	}
}
