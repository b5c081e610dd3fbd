// Package pgbouncer starts and stops PgBouncer processes on free loopback
// ports, in front of the PostgreSQL server the tests use (DATABASE_URL, or
// testenv's default), so that tests can run the store and the claim flows
// through a connection pooler in transaction pooling mode, the way many
// deployments run PostgreSQL.
//
// Each [Bouncer] has its own directory with a generated pgbouncer.ini and
// userlist.txt (auth_type trust: the server behind it decides), an admin
// console ([Bouncer.Admin]: SHOW, RECONNECT, KILL, PAUSE, RESUME), a
// [Bouncer.Restart] on the same port, and [Bouncer.Close], which stops the
// process and removes the directory. Every database name is forwarded to
// the server's database of the same name ("*"), and [Options.Databases]
// adds aliases with extra connection settings (a connect_query, for
// example). The process runs in the foreground, never as a system service;
// run as root, it drops to the postgres user (else nobody), as PgBouncer
// refuses to run as root.
//
// The pgbouncer binary is $PGBOUNCER when set, else pgbouncer on $PATH,
// else /usr/sbin/pgbouncer (where Debian's package puts it). When it is
// missing, [New] returns [ErrNoBinary]; [Start] then fails the test with
// CI=true (CI must never pass by skipping) and skips it with the reason
// otherwise.
//
//	b := pgbouncer.Start(t, pgbouncer.Options{}) // pool_mode = transaction
//	cfg := b.PoolConfig(t, "test", pgx.QueryExecModeExec) // no named prepared statements
//	_, err := b.Admin(ctx, "RECONNECT")
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package pgbouncer
