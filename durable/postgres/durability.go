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

// Durability is what [CheckDurability] finds, as the Claimer reads it from
// any store that can tell: "" when durable.
func (s *store) Durability(ctx context.Context) (string, error) {
	return durability(ctx, s.pool)
}
