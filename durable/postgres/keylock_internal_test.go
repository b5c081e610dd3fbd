package postgres

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/testkit/testenv"
)

// TestKeyLock_GoAndSQLAgree: Do computes the key's lock in Go (keyLock),
// the claim statements in SQL (keyLockSQL); both must name the same lock
// for every digest, the sign bit included, or a claim would not wait for a
// Do that holds the key.
func TestKeyLock_GoAndSQLAgree(t *testing.T) {
	t.Parallel()
	sch := testenv.Postgres(t)
	conn, err := pgx.Connect(t.Context(), sch.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	// keyLockSQL's second argument, alone.
	expr := "select ((get_byte($9::bytea, 0) << 24) | (get_byte($9::bytea, 1) << 16) | (get_byte($9::bytea, 2) << 8) | get_byte($9::bytea, 3))"
	if want := "pg_advisory_xact_lock(%NS, " + expr[len("select "):] + ")"; keyLockSQL != want {
		t.Fatalf("keyLockSQL = %s\nwant %s (this test's copy of it)", keyLockSQL, want)
	}
	if a, b := lockNamespace("s1.idempotency_requests"), lockNamespace("s2.idempotency_requests"); a == b {
		t.Fatalf("two tables share the lock namespace %d", a)
	}
	if q := buildQueries("s1.t", "t"); !strings.Contains(q.claim, fmt.Sprintf("pg_advisory_xact_lock(%d,", lockNamespace("s1.t"))) {
		t.Fatal("the claim statement does not lock in its table's namespace")
	}
	sql := strings.ReplaceAll(expr, "$9", "$1")
	for i := range 256 {
		d := sha256.Sum256([]byte{byte(i), byte(i >> 8)})
		d[0] = byte(i) // every first byte, both signs
		var got int32
		if err := conn.QueryRow(t.Context(), sql, d[:]).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != keyLock(d) {
			t.Fatalf("digest %x: SQL computes %d, Go %d", d[:4], got, keyLock(d))
		}
	}
}
