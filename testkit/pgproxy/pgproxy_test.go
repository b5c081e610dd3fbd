package pgproxy_test

import (
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// through returns a pool on a fresh schema holding a table t (n int),
// direct, and a pool to the same schema through a new proxy.
func through(t *testing.T) (direct, proxied *pgxpool.Pool, cutter *pgproxy.Cutter) {
	t.Helper()
	s := testenv.Postgres(t)
	ctx := t.Context()
	if _, err := s.Pool.Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	cutter, err = pgproxy.New("tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cutter.Close)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", cutter.Port()
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return s.Pool, pool, cutter
}

// A COMMIT through an armed proxy applies, and its acknowledgement is lost.
func TestCutCommit_AppliedAcknowledgementLost(t *testing.T) {
	direct, pool, cutter := through(t)
	ctx := t.Context()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES (2)`)
		cutter.Arm(pgproxy.CutCommit)
		return err
	})
	if err == nil {
		t.Fatal("the COMMIT's acknowledgement arrived")
	}
	var n int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM t WHERE n = 2`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || cutter.Cuts() != 1 {
		t.Fatalf("rows %d, cuts %d: want the commit applied and its answer lost", n, cutter.Cuts())
	}
}

// A statement in autocommit through an armed proxy applies, its reply is
// lost, and the function given to ArmThen runs once, at the cut.
func TestCutStatement_RunsThenAtTheCut(t *testing.T) {
	direct, pool, cutter := through(t)
	ctx := t.Context()
	var calls atomic.Int32
	cutter.ArmThen(pgproxy.CutStatement, func() { calls.Add(1) })
	if _, err := pool.Exec(ctx, `INSERT INTO t VALUES ($1)`, 3); err == nil {
		t.Fatal("the statement's reply arrived")
	}
	if _, err := pool.Exec(ctx, `INSERT INTO t VALUES ($1)`, 4); err != nil {
		t.Fatalf("after the cut the proxy is disarmed: %v", err)
	}
	var n int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 || cutter.Cuts() != 1 || calls.Load() != 1 {
		t.Fatalf("rows %d, cuts %d, then ran %d times: want 2, 1, 1", n, cutter.Cuts(), calls.Load())
	}
}

// SetDown(true) closes the connections through the proxy and refuses new
// ones, as an outage of the server; SetDown(false) lets them through again.
func TestSetDown_RefusesUntilUp(t *testing.T) {
	_, pool, cutter := through(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	cutter.SetDown(true)
	for range 3 {
		if _, err := pool.Exec(ctx, `INSERT INTO t VALUES (3)`); err == nil {
			t.Fatal("a statement went through a proxy that is down")
		}
	}
	cutter.SetDown(false)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatalf("after SetDown(false): %v", err)
	}
	if n != 1 {
		t.Fatalf("rows %d, want 1: nothing written while down", n)
	}
}
