package postgres_test

import (
	"testing"

	"github.com/oncekey/oncekey/testkit/pgproxy"
)

// newCutProxy starts a proxy in front of PostgreSQL that loses one reply on
// demand (see package pgproxy), closed when the test ends: the ambiguous
// outcome of issue 2, reproduced deterministically.
func newCutProxy(t testing.TB, network, target string) *pgproxy.Cutter {
	t.Helper()
	p, err := pgproxy.New(network, target)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}
