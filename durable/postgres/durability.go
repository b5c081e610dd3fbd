package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotDurable is matched by the error of [CheckDurability] when the
// database, as the pool's sessions see it, may lose a commit it has
// acknowledged: on a crash, or on a failover to a standby. The message names
// each setting and the value to set.
var ErrNotDurable = errors.New("durable/postgres: the database can lose acknowledged commits")

// durabilitySQL reads, in one round trip and as a session of the pool, the
// settings an acknowledged commit's survival depends on, how many standbys
// stream from this server, whether this server is a standby, the session's
// backend pid (a pooler in between shows the client another pid) and the
// two timeouts [ConfigurePool] sets. It starts as it always has, so tests
// that count a claim's statements can tell the Claimer's one-time check
// apart. It is sent with the simple protocol (it has no parameters), so
// reading it leaves no named prepared statement behind any pooler.
const durabilitySQL = `select current_setting('synchronous_commit'), current_setting('fsync'),
	current_setting('full_page_writes'), current_setting('synchronous_standby_names'),
	(select count(*) from pg_stat_replication), pg_is_in_recovery(), pg_backend_pid(),
	current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')`

// session is what durabilitySQL reads.
type session struct {
	syncCommit, fsync, fpw, standbyNames string
	standbys                             int64
	inRecovery                           bool
	pid                                  uint32
	lockTimeout, idleInTx                string
}

// readSession reads durabilitySQL on q.
func readSession(ctx context.Context, q querier) (session, error) {
	var v session
	err := q.QueryRow(ctx, durabilitySQL, pgx.QueryExecModeSimpleProtocol).Scan(&v.syncCommit, &v.fsync, &v.fpw,
		&v.standbyNames, &v.standbys, &v.inRecovery, &v.pid, &v.lockTimeout, &v.idleInTx)
	return v, err
}

func (v session) durabilityProblems() string {
	return durabilityProblems(v.syncCommit, v.fsync, v.fpw, v.standbyNames, v.standbys, v.inRecovery)
}

// CheckDurability reads, on a session of pool, what makes an acknowledged
// commit durable, and returns nil when a commit the database acknowledged
// survives a crash of the server and a failover to a synchronous standby.
// Otherwise it returns an error matching [ErrNotDurable] that names every
// setting to change:
//
//   - synchronous_commit = off: a crash loses the last acknowledged commits
//     (set it to on, in postgresql.conf, ALTER DATABASE/ROLE ... SET, or the
//     connection string; it is per session);
//   - fsync = off or full_page_writes = off: a crash can lose or corrupt
//     committed data;
//   - streaming standbys but no synchronous_standby_names: a failover loses
//     the commits the promoted standby had not received;
//   - synchronous_commit = local with synchronous standbys: likewise;
//   - a session on a standby (pg_is_in_recovery()), not on the primary: it
//     refuses every write, and what it reads can lag the primary's
//     commits.
//
// Every lost commit is a claim or a completion the library was told had
// happened: the key can then be claimed and run again. The store's Stats
// reports the same finding in Durability, and a claim.Claimer logs it and
// sets the oncekey.durable.degraded gauge. Call it at start-up and refuse to
// start (or alert) on ErrNotDurable. It returns an error matching
// durable.ErrUnavailable when the settings cannot be read.
//
// Behind a connection pooler the settings are those of the server session
// that serves the check, as they are for each statement of the store: a
// pooler such as PgBouncer refuses or drops the parameters of the
// connection string, so what counts is postgresql.conf, ALTER ROLE or
// ALTER DATABASE ... SET, and the pooler's own connect_query.
//
// It also checks that the pool can work behind the pooler in front of the
// database, if there is one (see the package documentation, "PgBouncer"),
// and returns an error matching [ErrConfig] whose message says what to
// change when it cannot: named prepared statements (pgx's default query
// exec mode) lost between transactions, or the pool's lock_timeout or
// idle_in_transaction_session_timeout startup parameters (ConfigurePool)
// not reaching the server sessions. A pooler shows the client a backend
// pid that is not its server session's; only then does the check try a
// named prepared statement, on a second connection it opens and closes.
func CheckDurability(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return fmt.Errorf("%w: CheckDurability: nil pool", ErrConfig)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return translate("durability", err)
	}
	defer conn.Release()
	v, err := readSession(ctx, conn)
	if err != nil {
		return translate("durability", err)
	}
	if err := checkPooler(ctx, pool.Config().ConnConfig, conn.Conn().PgConn(), v); err != nil {
		return err
	}
	if problems := v.durabilityProblems(); problems != "" {
		return fmt.Errorf("%w: %s", ErrNotDurable, problems)
	}
	return nil
}

// checkPooler returns a poolerError when the pool configured by cfg cannot
// work behind the pooler between conn and the server, nil when it can or
// when there is none. v is what conn's session read.
func checkPooler(ctx context.Context, cfg *pgx.ConnConfig, conn *pgconn.PgConn, v session) error {
	if dropped := droppedParams(cfg, v); dropped != "" {
		return fmt.Errorf("durable/postgres: durability: %w", &poolerError{problem: fmt.Sprintf(startupDroppedProblem, dropped)})
	}
	if conn.PID() == v.pid || cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil // no pooler in between, or no named statements to lose
	}
	lost, err := namedStatementsLost(ctx, cfg, conn)
	if err != nil {
		return translate("durability (pooler check)", err)
	}
	if lost {
		return fmt.Errorf("durable/postgres: durability: %w", &poolerError{problem: namedStatementsProblem})
	}
	return nil
}

// droppedParams names the timeouts the pool sends as startup parameters
// (other than 0) that the session v does not have: something between the
// pool and the server dropped them. "" when none.
func droppedParams(cfg *pgx.ConnConfig, v session) string {
	var dropped []string
	for _, p := range []struct{ name, session string }{{paramLockTimeout, v.lockTimeout}, {paramIdleInTx, v.idleInTx}} {
		if want, ok := cfg.RuntimeParams[p.name]; ok && !isZeroSetting(want) && isZeroSetting(p.session) {
			dropped = append(dropped, p.name)
		}
	}
	return strings.Join(dropped, " and ")
}

func isZeroSetting(v string) bool {
	switch strings.TrimSpace(v) {
	case "0", "0ms", "0s", "":
		return true
	}
	return false
}

// probeAttempts bounds how often namedStatementsLost tries: each attempt
// catches a transaction pooler unless another client takes the server
// session in between.
const probeAttempts = 3

// namedStatementsLost reports whether a named prepared statement does not
// stay with conn between transactions. conn (behind the pooler) prepares
// one under a random name; a second connection, opened with cfg, looks for
// that name in its own session (a transaction pooler hands it the server
// session conn just released: PgBouncer reuses the last released one);
// then conn runs the statement, which fails with 26000 when its next
// transaction runs on another server session. A pooler that keeps
// protocol-level statements per client (PgBouncer 1.21+ with
// max_prepared_statements renames them) or that pools by session passes.
func namedStatementsLost(ctx context.Context, cfg *pgx.ConnConfig, conn *pgconn.PgConn) (bool, error) {
	other, err := pgconn.ConnectConfig(ctx, cfg.Config.Copy())
	if err != nil {
		return false, err
	}
	defer func() {
		cctx, cancel := detached(ctx)
		defer cancel()
		_ = other.Close(cctx)
	}()
	for range probeAttempts {
		var b [8]byte
		_, _ = rand.Read(b[:])
		name := "oncekey_probe_" + hex.EncodeToString(b[:])
		if _, err := conn.Prepare(ctx, name, "SELECT 1", nil); err != nil {
			return false, err
		}
		res, err := other.Exec(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE name = '"+name+"'").ReadAll()
		if err != nil {
			return false, err
		}
		seen := len(res) == 1 && len(res[0].Rows) == 1 && string(res[0].Rows[0][0]) != "0"
		_, runErr := conn.ExecPrepared(ctx, name, nil, nil, nil).Close()
		_ = conn.Deallocate(ctx, name) // on the server session this runs on, which may not have it
		var pgErr *pgconn.PgError
		switch {
		case seen, errors.As(runErr, &pgErr) && pgErr.Code == "26000":
			return true, nil
		case runErr != nil:
			return false, runErr
		}
	}
	return false, nil
}

func durabilityProblems(syncCommit, fsync, fpw, standbyNames string, standbys int64, inRecovery bool) string {
	var p []string
	if inRecovery {
		p = append(p, "the session is on a standby (pg_is_in_recovery() is true), not on the primary: it refuses every write and its reads can lag the primary's commits; connect the pool to the primary")
	}
	if syncCommit == "off" {
		p = append(p, "synchronous_commit=off loses the last acknowledged commits on a crash: set synchronous_commit = on (postgresql.conf, ALTER DATABASE or ALTER ROLE ... SET, or the connection string)")
	}
	if fsync == "off" {
		p = append(p, "fsync=off can lose or corrupt committed data on a crash: set fsync = on in postgresql.conf")
	}
	if fpw == "off" {
		p = append(p, "full_page_writes=off can corrupt data on a crash: set full_page_writes = on in postgresql.conf")
	}
	sync := strings.TrimSpace(standbyNames) != ""
	if !sync && standbys > 0 {
		p = append(p, fmt.Sprintf("%d streaming standby(s) but synchronous_standby_names is empty: a failover loses the commits the standby had not received; set synchronous_standby_names and synchronous_commit = on or remote_apply", standbys))
	}
	if sync && syncCommit == "local" {
		p = append(p, "synchronous_commit=local does not wait for the synchronous standbys: a failover loses the commits they had not received; set synchronous_commit = on or remote_apply")
	}
	return strings.Join(p, "; ")
}

// Durability is what [CheckDurability] finds about durability: "" when
// durable. When the pool's startup parameters (ConfigurePool's) do not
// reach the server session (a pooler drops them), the store stops relying
// on them from then on and bounds its own statements, as on an
// unconfigured pool.
func (s *store) Durability(ctx context.Context) (string, error) {
	v, err := readSession(ctx, s.pool)
	if err != nil {
		return "", translate("durability", err)
	}
	s.noteSession(v)
	return v.durabilityProblems(), nil
}

// noteSession stops the store relying on the pool's lock_timeout when v, a
// session of the pool, does not have it.
func (s *store) noteSession(v session) {
	if s.sessionOK.Load() && droppedParams(s.pool.Config().ConnConfig, v) != "" {
		s.sessionOK.Store(false)
	}
}

// SessionSettings is what a claim.Claimer reads once, on a session of the
// pool, and logs: durability, what [CheckDurability] finds ("" when
// durable); timeouts, "" when the pool's sessions have lock_timeout and
// idle_in_transaction_session_timeout (set by [ConfigurePool], or by the
// connection string, ALTER ROLE or ALTER DATABASE), otherwise which is off
// and what that risks. A session without them is what a pool not
// configured with ConfigurePool gives: the store bounds its own statements
// and transactions, but a transaction the caller begins on the pool
// (claim.Claimer.DoTx, claimriver's) can wait for a row lock, or hold one,
// without bound. When the pool sends them as startup parameters but the
// session lacks them (a pooler drops them), timeouts says so, and the
// store bounds its own statements from then on.
func (s *store) SessionSettings(ctx context.Context) (durability, timeouts string, err error) {
	v, err := readSession(ctx, s.pool)
	if err != nil {
		return "", "", translate("settings", err)
	}
	s.noteSession(v)
	timeouts = timeoutProblems(v.lockTimeout, v.idleInTx)
	if dropped := droppedParams(s.pool.Config().ConnConfig, v); dropped != "" {
		timeouts = (&poolerError{problem: fmt.Sprintf(startupDroppedProblem, dropped)}).Error()
	}
	return v.durabilityProblems(), timeouts, nil
}

// timeoutProblems returns "" when both timeouts are on (not "0"), otherwise
// what is off, what it risks and what to do.
func timeoutProblems(lockTimeout, idleInTx string) string {
	var off []string
	if lockTimeout == "0" {
		off = append(off, paramLockTimeout)
	}
	if idleInTx == "0" {
		off = append(off, paramIdleInTx)
	}
	if len(off) == 0 {
		return ""
	}
	return strings.Join(off, " and ") + " off in the pool's sessions: a transaction begun on the pool (DoTx, claimriver) can wait for a row lock, or hold one, without bound; configure the pool with postgres.ConfigurePool before pgxpool.NewWithConfig (behind PgBouncer in transaction mode: set them with ALTER ROLE ... SET)"
}
