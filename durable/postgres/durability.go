package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotDurable is matched by the error of [CheckDurability] when the
// database, as the pool's sessions see it, may lose a commit it has
// acknowledged: on a crash, or on a failover to a standby. The message names
// each setting and the value to set.
var ErrNotDurable = errors.New("durable/postgres: the database can lose acknowledged commits")

// durabilitySQL reads, in one round trip and as a session of the pool, the
// settings an acknowledged commit's survival depends on, and how many
// standbys stream from this server.
const durabilitySQL = `select current_setting('synchronous_commit'), current_setting('fsync'),
	current_setting('full_page_writes'), current_setting('synchronous_standby_names'),
	(select count(*) from pg_stat_replication)`

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
//   - synchronous_commit = local with synchronous standbys: likewise.
//
// Every lost commit is a claim or a completion the library was told had
// happened: the key can then be claimed and run again. The store's Stats
// reports the same finding in Durability, and a claim.Claimer logs it and
// sets the oncekey.durable.degraded gauge. Call it at start-up and refuse to
// start (or alert) on ErrNotDurable. It returns an error matching
// durable.ErrUnavailable when the settings cannot be read.
func CheckDurability(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return fmt.Errorf("%w: CheckDurability: nil pool", ErrConfig)
	}
	problems, err := durability(ctx, pool)
	if err != nil {
		return err
	}
	if problems != "" {
		return fmt.Errorf("%w: %s", ErrNotDurable, problems)
	}
	return nil
}

// durability returns "" when acknowledged commits are durable, otherwise
// the problems found and the setting to change for each.
func durability(ctx context.Context, q querier) (string, error) {
	var syncCommit, fsync, fpw, standbyNames string
	var standbys int64
	if err := q.QueryRow(ctx, durabilitySQL).Scan(&syncCommit, &fsync, &fpw, &standbyNames, &standbys); err != nil {
		return "", translate("durability", err)
	}
	return durabilityProblems(syncCommit, fsync, fpw, standbyNames, standbys), nil
}

func durabilityProblems(syncCommit, fsync, fpw, standbyNames string, standbys int64) string {
	var p []string
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

// Durability is what [CheckDurability] finds: "" when durable.
func (s *store) Durability(ctx context.Context) (string, error) {
	return durability(ctx, s.pool)
}

// settingsSQL is durabilitySQL and the two timeouts [ConfigurePool] sets,
// as a session of the pool has them, in one round trip. It starts as
// durabilitySQL does, so tests that count a claim's statements can tell
// the Claimer's one-time check apart.
const settingsSQL = durabilitySQL + `,
	current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')`

// SessionSettings is what a claim.Claimer reads once, on a session of the
// pool, and logs: durability, what [CheckDurability] finds ("" when
// durable); timeouts, "" when the pool's sessions have lock_timeout and
// idle_in_transaction_session_timeout (set by [ConfigurePool], or by the
// connection string, ALTER ROLE or ALTER DATABASE), otherwise which is off
// and what that risks. A session without them is what a pool not
// configured with ConfigurePool gives: the store bounds its own statements
// and transactions, but a transaction the caller begins on the pool
// (claim.Claimer.DoTx, claimriver's) can wait for a row lock, or hold one,
// without bound.
func (s *store) SessionSettings(ctx context.Context) (durability, timeouts string, err error) {
	var syncCommit, fsync, fpw, standbyNames, lockTimeout, idleInTx string
	var standbys int64
	if err := s.pool.QueryRow(ctx, settingsSQL).Scan(&syncCommit, &fsync, &fpw, &standbyNames, &standbys, &lockTimeout, &idleInTx); err != nil {
		return "", "", translate("settings", err)
	}
	return durabilityProblems(syncCommit, fsync, fpw, standbyNames, standbys), timeoutProblems(lockTimeout, idleInTx), nil
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
	return strings.Join(off, " and ") + " off in the pool's sessions: a transaction begun on the pool (DoTx, claimriver) can wait for a row lock, or hold one, without bound; configure the pool with postgres.ConfigurePool before pgxpool.NewWithConfig"
}
