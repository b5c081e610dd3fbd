// Package sqlite is the embedded, single-node backend of the durable store
// contract (package durable), on a SQLite database file through the pure-Go
// driver github.com/ncruces/go-sqlite3 (no cgo: SQLite translated to Go). It
// is the default when no PostgreSQL is named: nothing to install, one file
// on disk.
//
//	db, err := sqlite.Open(filepath.Join(dir, "oncekey.db"))
//	...
//	defer db.Close()
//	if err := sqlite.Migrate(ctx, db); err != nil { ... }
//	store, err := sqlite.New(db)
//
// It passes the same contract suite (testkit/storetest) as the PostgreSQL
// backend, unchanged.
//
// # What it guarantees, on one node
//
//   - Claim is one INSERT ... ON CONFLICT ... DO UPDATE ... WHERE ... RETURNING
//     statement: the database alone decides who owns a key; never
//     check-then-insert. Generations become max(proposed, stored+1), and at
//     least the clock floor for a created or restarted record (see below). When
//     the rule refuses, that statement writes nothing and a second one
//     reads the record to return (replay, in progress, mismatch), still
//     under the store's write lock (if another process changed the record in
//     between, the claim is tried again); a fresh claim, a Complete and a Get are one statement
//     each. Statements are prepared once per store.
//   - Complete, Fail, MarkUncertain, Renew and Release are each one UPDATE
//     matching owner, generation and state; zero rows is [durable.ErrFenced].
//     A workflow's step is started and settled in one write transaction
//     that reads the record held by the token and writes the step (and,
//     for a step an earlier attempt left unfinished, the record); it is
//     finished with one UPDATE matching the token and the step together.
//   - Lease and retention decisions use the database's clock
//     (unixepoch('subsec'), millisecond resolution, stored as integer
//     microseconds). On one node the database's clock is the host's clock:
//     every process on the host reads the same one, so worker clock skew
//     does not exist here; a host clock step (NTP, a VM resume) moves every
//     lease at once, as it would move PostgreSQL's.
//   - The file is in WAL mode, so reads (Get, Stats, Pending) never
//     wait for the writer, and synchronous=FULL, so a
//     commit is on disk when it returns: a completion survives a power loss
//     as well as a crash. (NORMAL would be faster but, in WAL mode, may lose
//     the last commits on power loss, which would let a retried request run
//     its effect a second time.)
//   - Writes are serialized: SQLite has one writer at a time. Within a store
//     they queue on a Go lock; across Stores and processes on SQLite's lock
//     with a busy timeout ([WithBusyTimeout], default 5 s,
//     less than 30 s). Every write
//     transaction takes the write lock at its start (BEGIN IMMEDIATE), so
//     none fails later upgrading a read lock: concurrent claims in one
//     process neither fail spuriously nor deadlock. A write that still waits
//     longer than the busy timeout fails with [durable.ErrUnavailable].
//   - Same-transaction mode: InTx gives a *sql.Tx on which Claim, the
//     caller's own statements (on its tables in the same file, through the
//     *sql.DB) and Complete, each given that tx, commit together. While it
//     is open every other writer waits, so a concurrent claimer of the same
//     key then sees the committed outcome, never a second acquisition. Keep
//     such transactions short: they stop every writer of the file.
//   - A commit cannot be ambiguous in-process: SQLite either applied it or
//     rolled it back before returning, and reports which. A COMMIT refused
//     for a deferred constraint (a foreign key of the caller's tables
//     declared DEFERRABLE INITIALLY DEFERRED) committed nothing and
//     InTx returns its error as it is, not [durable.ErrUnavailable];
//     a busy or I/O failure at COMMIT is [durable.ErrUnavailable] (nothing
//     committed; the driver rolls back what SQLite kept open). Fenced writes
//     are still verified by re-reading after an error or zero rows, so a
//     repeated Complete with the same token and result (headers compared
//     byte for byte) succeeds.
//   - Retention: a record expires its claim's retention after its creation,
//     and Complete and Fail move that to at least a retention after they
//     finished; a takeover gives it a full retention from the takeover.
//   - Generations only rise for a scope, also across Sweep: a
//     created or restarted record gets at least the database's clock in
//     milliseconds since the Unix epoch minus 60000, and Sweep deletes a
//     record only once its generation is below that clock minus 120000
//     (about a minute after its creation). The busy timeout bounds how long
//     a claim waits, far below the 60 s this leaves. The host's clock must
//     not step back by more than about a minute.
//   - Keys are stored only as SHA-256, or HMAC-SHA-256 with [WithKeySecret].
//     No key, tenant or body is logged; errors never contain them.
//   - A closed database, a file that cannot be opened, an I/O error or a
//     lock held past the busy timeout surface as [durable.ErrUnavailable]
//     wrapping the cause.
//
// # What it does not do
//
//   - It is not shared between hosts. A SQLite file on a network file
//     system (NFS, SMB) does not get working locks or WAL shared memory;
//     use the PostgreSQL backend for more than one host, or for more than
//     one process on more than one host.
//   - Several processes on one host may share the file when its file system
//     supports POSIX locks and shared memory (a local disk: ext4, xfs, apfs,
//     ntfs). The tests run several processes claiming the same keys of one
//     file on ext4 and check that each key is acquired once; nothing else
//     was tested.
//   - Throughput is that of one writer with an fsync per commit. Stats reads
//     the whole table.
//
// # Schema and migrations
//
// [Migrate] runs the embedded migrations (see [Migrations]) not
// applied yet, and records each version in table oncekey_migration (per
// store table). 001_create_idempotency_requests creates a STRICT, WITHOUT
// ROWID table keyed by (tenant_id, operation, key_hash), with partial
// indexes for the sweeper and the reconciler. 002_retention_and_binary_headers
// adds retention_us (the retention each claim stores, for a late finish) and
// response_headers_bin (headers byte for byte; the JSON column stays as a
// lossy copy for the previous version), and converts existing rows.
// 003_operation_digest adds the digest of the operation identity, indexed.
// 004_steps adds the table of a workflow's steps (claim's Lease.Step),
// named after the records' table with "_steps", one row per step of an
// operation's current life (its created_at, which a restart as a new
// operation moves strictly forward); Sweep deletes a record's steps with it.
// [WithTable] renames the table and its indexes. A database migrated by a
// release that did not record versions is brought up to date (001 is
// idempotent). Do not mix [Migrate] with another migration tool on the
// same table.
package sqlite
