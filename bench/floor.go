package main

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// The lease and retention every claim asks for (the library's defaults,
// which env's claimers set explicitly so the floors cannot drift from them),
// and in the units the statements and the script take.
const (
	benchLease     = 30 * time.Second
	benchRetention = 24 * time.Hour
)

var (
	leaseUs     = benchLease.Microseconds()
	retentionUs = benchRetention.Microseconds()
	leaseMs     = benchLease.Milliseconds()
)

// floors are the library-free ways of doing what a workload does: the
// library's own statements and script, captured from it at start-up so the
// floors cannot drift from what they are compared to.
type floors struct {
	e         *env
	beginSQL  string         // the library's BEGIN (with its SET LOCALs)
	claimSQL  string         // the durable claim: INSERT ... ON CONFLICT ... RETURNING
	claimNew  string         // the claim of a key Redis granted: INSERT ... ON CONFLICT DO NOTHING
	slim      slimStatements // on the slim record with slimHotIndexes
	slimPend  slimStatements // on the slim record with slimPendingIndexes
	finishSQL string         // the fenced completion: UPDATE ... SET state = 'completed'
	insertSQL string         // Do's record, inserted finished with the COMMIT
	// locked and lockedDigestKey are what Do sends by default, locking
	// first, on the store's table and on the digest-keyed one (captured)
	locked, lockedDigestKey lockFirstStatements
	pkOnlySQL               string // insertSQL into the record's table with its primary key alone
	selectSQL               string // a bare read of a stored result
	sha                     string // claim.lua's SHA1
	headers                 string // result.Headers as JSON text, encoded once (the store sends it as text)
	binHeaders              []byte // result.Headers in the store's byte-exact encoding, captured

	// complete.lua's SHA1, and the result and TTL Do cached with it
	completeSHA  string
	completeBlob string
	completeTTL  int64
	// completeAsync: Do sent complete.lua after it returned, off the
	// caller's path, and did not wait for it
	completeAsync bool
	// syncgen.lua's SHA1, when Do sent it (captured likewise): the call by
	// which Do confirmed its lease from a goroutine while fn ran
	syncgenSHA string
	// asyncErr is the first error of a script call floor-lock-first-redis
	// did not wait for, returned by its next request
	asyncErr atomic.Pointer[error]
}

func newFloors(ctx context.Context, e *env) (*floors, error) {
	f := &floors{e: e,
		slim: slimFor(e.slimTable), slimPend: slimFor(e.slimPendingTable)}
	j, err := json.Marshal(result.Headers)
	if err != nil {
		return nil, err
	}
	f.headers = string(j)
	if err := f.captureSQL(ctx); err != nil {
		return nil, err
	}
	into := "INSERT INTO " + e.table + " "
	if f.pkOnlySQL = strings.Replace(f.insertSQL, into, "INSERT INTO "+e.pkOnlyTable+" ", 1); !strings.Contains(f.insertSQL, into) {
		return nil, fmt.Errorf("%w: the record INSERT does not start %q", ErrCapture, into)
	}
	if err := f.createClaimInBegin(ctx); err != nil {
		return nil, err
	}
	if err := f.captureScript(ctx); err != nil {
		return nil, err
	}
	calls := "claim.lua, "
	if f.syncgenSHA != "" {
		calls += "syncgen.lua (from a goroutine, not waited for), "
	}
	calls += "complete.lua"
	if f.completeAsync {
		calls += " (after its answer, not waited for)"
	}
	logf("floors: a fresh Do with Redis sent %s; floor-lock-first-redis sends the same", calls)
	f.selectSQL = `SELECT state, request_hash, status_code, response_headers, response_body, response_version, resource_id
FROM ` + e.table + ` WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3`
	return f, nil
}

func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

func (f *floors) claimArgs(h []byte, owner uuid.UUID) []any {
	return []any{tenant, operation, h, fingerprint, int64(0), pgUUID(owner), leaseUs, retentionUs, h} // the last: the operation digest (any 32 bytes for the floor)
}

// insertArgs are the record INSERT's: the library proposes the client's clock
// less 30 s as the generation when Redis proposes none.
func (f *floors) insertArgs(h []byte, gen int64, owner uuid.UUID) []any {
	return []any{tenant, operation, h, fingerprint, gen, pgUUID(owner), result.StatusCode, f.headers, f.binHeaders,
		result.Body, result.Version, result.ResourceID, retentionUs, h} // the last: the operation digest (any 32 bytes for the floor)
}

// sameShape reports whether the floor's arguments have the types of the
// library's, position by position.
func sameShape(got, want []any) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if fmt.Sprintf("%T", plain(got[i])) != fmt.Sprintf("%T", plain(want[i])) {
			return false
		}
	}
	return true
}

// plain is v as go-redis writes it: the library may hand it pointers into
// a command it built in one allocation (*string, *int64 are written as
// their values), and any integer is an integer.
func plain(v any) any {
	switch x := v.(type) {
	case *string:
		return *x
	case *int64:
		return *x
	case *int:
		return int64(*x)
	case *uint64:
		return int64(*x)
	case int:
		return int64(x)
	case encoding.BinaryMarshaler: // go-redis writes what it returns
		if b, err := x.MarshalBinary(); err == nil {
			return string(b)
		}
	}
	return v
}

// captureSQL records the statements of one Do (with the fresh workload's
// business write) on the Redis Claimer with the write at commit
// (claim.WithWriteAtCommit) and keeps its BEGIN and its record INSERT, and
// the claim statement of one Claim without Redis (the full claim). It
// checks that Do sent BEGIN, the order INSERT, then the record INSERT with
// COMMIT, as the floor sends them; then what Do sends by default, locking
// first (captureLockFirst), and the workflow's claim and completion
// (captureClaimNew).
func (f *floors) captureSQL(ctx context.Context) error {
	h := make([]byte, 32)
	err := f.captureDo(ctx, f.e.atCommit, randName("capture-"), "begin,order,record,commit", func(i int, s pgx.TraceQueryStartData) string {
		switch {
		case i == 0 && strings.HasPrefix(strings.ToLower(s.SQL), "begin"):
			f.beginSQL = s.SQL
			return "begin"
		case isInsertAtCommitSQL(s.SQL) && len(s.Args) > 8 && sameShape(f.insertArgs(h, 1, uuid.Nil), s.Args):
			// The ninth argument is the byte-exact header encoding of the
			// (constant) result: the floor sends the library's own bytes.
			f.insertSQL = s.SQL
			f.binHeaders, _ = s.Args[8].([]byte)
			return "record"
		}
		return ""
	})
	if err != nil {
		return err
	}
	stmts, err := f.e.sql.capture(func() error {
		out, err := f.e.noRedis.Claim(ctx, request(randName("capture-")))
		if err == nil && out.Lease != nil {
			err = out.Lease.Release(ctx)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: Claim: %w", ErrCapture, err)
	}
	for _, s := range stmts {
		if isClaimSQL(s.SQL) && !strings.Contains(s.SQL, "DO NOTHING") && sameShape(f.claimArgs(h, uuid.Nil), s.Args) {
			f.claimSQL = s.SQL
		}
	}
	if f.claimSQL == "" {
		return fmt.Errorf("%w: no claim statement of the expected shape among %d statements", ErrCapture, len(stmts))
	}
	if err := f.captureLockFirst(ctx); err != nil {
		return err
	}
	return f.captureClaimNew(ctx)
}

// finishArgs are the completion's: the record (h is its key hash and, as
// in claimArgs, its operation digest), the token, the result.
func (f *floors) finishArgs(h []byte, gen int64, owner uuid.UUID) []any {
	return []any{tenant, operation, h, h, gen, pgUUID(owner), result.StatusCode, f.headers,
		result.Body, result.Version, result.ResourceID, f.binHeaders}
}

// lockFirstStatements are the statements of Do's default protocol on
// PostgreSQL (it locks first, issue 44) on one table: the query that opens
// its transaction and the finished record's INSERT sent with the COMMIT.
type lockFirstStatements struct {
	begin  lockBegin
	insert string
}

// lockBegin is the query that opens Do's transaction when it locks first:
// the library's BEGIN (with its SET LOCALs), then, in the same
// simple-protocol message, the key's advisory lock and the check that no
// record of the key exists (with, in later library versions, its
// generation checked against the clock floor), as Do sent it for one key,
// cut around the values it interpolates for each request: parts[i] comes
// before the value slots[i], parts[len(slots)] last.
type lockBegin struct {
	parts []string
	slots []int
}

// The values a lock-first BEGIN interpolates: the second int of the key's
// lock (the first 32 bits of the operation digest), the digest's 64 hex
// digits, the generation.
const (
	slotLock = iota
	slotDigest
	slotGen
)

// lockBeginValues are the values as the BEGIN writes them: the lock is
// the lock function's last argument.
func lockBeginValues(d []byte, gen int64) [3]string {
	return [3]string{", " + strconv.FormatInt(int64(int32(binary.BigEndian.Uint32(d[:4]))), 10) + ")",
		hex.EncodeToString(d), strconv.FormatInt(gen, 10)}
}

// parseLockBegin cuts sql, the lock-first BEGIN Do sent for operation
// digest d at generation gen, around those values: the lock and the digest
// must occur once each, the generation at most once.
func parseLockBegin(sql string, d []byte, gen int64) (lockBegin, error) {
	vals := lockBeginValues(d, gen)
	type at struct{ pos, slot int }
	var found []at
	for slot, v := range vals {
		switch n := strings.Count(sql, v); {
		case n == 1:
			found = append(found, at{strings.Index(sql, v), slot})
		case n == 0 && slot == slotGen:
		default:
			return lockBegin{}, fmt.Errorf("%w: the lock-first BEGIN holds %q %d times: %q", ErrCapture, v, n, sql)
		}
	}
	slices.SortFunc(found, func(a, b at) int { return a.pos - b.pos })
	var t lockBegin
	last := 0
	for _, x := range found {
		if x.pos < last {
			return lockBegin{}, fmt.Errorf("%w: the lock-first BEGIN's values overlap: %q", ErrCapture, sql)
		}
		t.parts = append(t.parts, sql[last:x.pos])
		t.slots = append(t.slots, x.slot)
		last = x.pos + len(vals[x.slot])
	}
	t.parts = append(t.parts, sql[last:])
	if got := t.build(d, gen); got != sql {
		return lockBegin{}, fmt.Errorf("%w: the lock-first BEGIN does not rebuild: %q from %q", ErrCapture, got, sql)
	}
	return t, nil
}

// build is the BEGIN for operation digest d at generation gen.
func (t lockBegin) build(d []byte, gen int64) string {
	vals := lockBeginValues(d, gen)
	var b strings.Builder
	for i, slot := range t.slots {
		b.WriteString(t.parts[i])
		b.WriteString(vals[slot])
	}
	b.WriteString(t.parts[len(t.slots)])
	return b.String()
}

// captureLockFirst records one Do on each of the Claimers without and
// with Redis and on the digest-keyed one without Redis, which lock first
// (Do's default on PostgreSQL), checks each sent its BEGIN with the key's
// lock and the record check, the order INSERT, then the record INSERT with
// COMMIT, and keeps the BEGIN (cut around its values: parseLockBegin) and
// the INSERT of each table; the Do with Redis must send what the one
// without did, at its own values.
func (f *floors) captureLockFirst(ctx context.Context) error {
	h := make([]byte, 32)
	for _, c := range []struct {
		name  string
		c     *claim.Claimer[pgx.Tx]
		table string
		st    *lockFirstStatements
		check bool // the statements are known: check them
	}{
		{"without Redis", f.e.noRedis, f.e.table, &f.locked, false},
		{"with Redis", f.e.withRedis, f.e.table, &f.locked, true},
		{"digest-keyed, without Redis", f.e.digestKeyNoRedis, f.e.digestKeyTable, &f.lockedDigestKey, false},
	} {
		key := randName("capture-")
		d := scope(key).Ref(nil).Digest()
		var begin string
		var gen int64
		err := f.captureDo(ctx, c.c, key, "begin,order,record,commit", func(i int, s pgx.TraceQueryStartData) string {
			switch {
			case i == 0 && strings.HasPrefix(s.SQL, f.beginSQL+"; ") && strings.Contains(s.SQL, "pg_advisory_xact_lock("):
				begin = s.SQL
				return "begin"
			case isInsertAtCommitSQL(s.SQL) && strings.Contains(s.SQL, c.table+" ") && sameShape(f.insertArgs(h, 1, uuid.Nil), s.Args):
				gen, _ = s.Args[4].(int64)
				if c.check && s.SQL != c.st.insert {
					return "other record"
				}
				c.st.insert = s.SQL
				return "record"
			}
			return ""
		})
		if err != nil {
			return fmt.Errorf("%w (Do %s, locking first)", err, c.name)
		}
		if c.check {
			if want := c.st.begin.build(d[:], gen); begin != want {
				return fmt.Errorf("%w: Do %s sent the BEGIN %q; want %q", ErrCapture, c.name, begin, want)
			}
			continue
		}
		if c.st.begin, err = parseLockBegin(begin, d[:], gen); err != nil {
			return fmt.Errorf("%w (Do %s)", err, c.name)
		}
	}
	return nil
}

// captureClaimNew records one Claim on the Redis Claimer, which claims a
// key Redis granted with the insert alone (ClaimParams.ExpectNew), and
// Lease.Complete, checks they sent that insert and the completion (each
// possibly after a SET of the lock timeout, in the same round trip), and
// keeps both: floor-claim-new's claim and the completion of every
// claim-first floor. Since issue 44 Do claims first only for a key whose
// record exists unfinished (or on a store that cannot lock first); the
// workflow (Claim, the caller's transaction, Lease.Complete) claims so
// every time.
func (f *floors) captureClaimNew(ctx context.Context) error {
	h := make([]byte, 32)
	stmts, err := f.e.sql.capture(func() error {
		out, err := f.e.withRedis.Claim(ctx, request(randName("capture-")))
		if err != nil {
			return err
		}
		if out.Kind != claim.Acquired || out.Lease == nil {
			return fmt.Errorf("%w: Claim of a fresh key answered %v", ErrUnexpected, out.Kind)
		}
		return out.Lease.Complete(ctx, result)
	})
	if err != nil {
		return fmt.Errorf("%w: Claim and Complete: %w", ErrCapture, err)
	}
	var shape []string
	for _, s := range stmts {
		switch {
		case strings.Contains(s.SQL, "set_config('lock_timeout'"):
			// The store's own lock timeout on a pooled session that lacks it.
		case isClaimSQL(s.SQL) && strings.Contains(s.SQL, "DO NOTHING") && sameShape(f.claimArgs(h, uuid.Nil), s.Args):
			f.claimNew = s.SQL
			shape = append(shape, "claim")
		case isCompletionSQL(s.SQL) && sameShape(f.finishArgs(h, 1, uuid.Nil), s.Args):
			f.finishSQL = s.SQL
			shape = append(shape, "complete")
		default:
			shape = append(shape, "other: "+firstLine(s.SQL))
		}
	}
	if got := strings.Join(shape, ","); got != "claim,complete" {
		return fmt.Errorf("%w: Claim and Complete sent %s; want claim,complete", ErrCapture, got)
	}
	return nil
}

// firstLine is the start of a statement, for an error.
func firstLine(sql string) string {
	if i := strings.IndexByte(sql, '\n'); i >= 0 {
		sql = sql[:i]
	}
	if len(sql) > 80 {
		sql = sql[:80] + "…"
	}
	return sql
}

// captureDo records the statements of one Do of the fresh workload on c
// for key, names each with kind (which keeps what it needs; "" for none of
// its own), and checks the names read want. The order INSERT and COMMIT
// are named here; an error names the start of each statement kind did not.
func (f *floors) captureDo(ctx context.Context, c *claim.Claimer[pgx.Tx], key, want string, kind func(i int, s pgx.TraceQueryStartData) string) error {
	stmts, err := f.e.sql.capture(func() error {
		_, err := doOrder(ctx, f.e, c, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: Do: %w", ErrCapture, err)
	}
	shape := make([]string, len(stmts))
	var others []string
	for i, s := range stmts {
		switch shape[i] = kind(i, s); {
		case shape[i] != "":
		case s.SQL == f.e.insertOrder:
			shape[i] = "order"
		case strings.EqualFold(s.SQL, "commit"):
			shape[i] = "commit"
		default:
			shape[i] = "other"
			others = append(others, fmt.Sprintf("%q", firstLine(s.SQL)))
		}
	}
	if got := strings.Join(shape, ","); got != want {
		return fmt.Errorf("%w: Do sent %s; want %s (unrecognised: %s)", ErrCapture, got, want, strings.Join(others, ", "))
	}
	return nil
}

// captureScript records the Redis commands of one Do on the Redis Claimer
// (locking first) and keeps the SHA of the first script it ran (claim.lua)
// and, from the second (complete.lua), its SHA and the cached result it
// wrote, and whether Do waited for its answer or returned first (it sent
// it off the caller's path: completeAsync). A syncgen.lua call, by
// which Do confirmed its tentative lease from a goroutine while fn ran
// (issue 43.1; since dropped from the lock-first path), is recognised by
// its shape and its SHA kept. floor-lock-first-redis sends what was seen,
// as it was seen; floor-claim-new-redis sends claim.lua and complete.lua
// and waits for both.
func (f *floors) captureScript(ctx context.Context) error {
	// syncgen.lua: the key; generation, owner.
	syncgen := []any{"evalsha", "", 1, "", int64(0), ""}
	// complete.lua: the key; owner, generation, fingerprint, result, TTL.
	complete := []any{"evalsha", "", 1, "", "", int64(0), fingerprint, "", int64(0)}
	var answered map[int]bool // the commands answered when Do returned
	cmds, err := f.e.rc.capture(func() error {
		if _, err := f.e.withRedis.Do(ctx, request(randName("capture-")), emptyWrite); err != nil {
			return err
		}
		answered = f.e.rc.answeredSoFar()
		// complete.lua may follow Do's answer: wait for it, then a moment
		// for a call still on its way.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if f.e.rc.seen(func(args []any) bool { return sameShape(args, complete) }) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: Do: %w", ErrCapture, err)
	}
	// claim.lua: the record's key; fingerprint, owner, lease. complete.lua:
	// the key; owner, generation, fingerprint, result, TTL.
	shapes := []struct {
		name string
		want []any
	}{
		{"claim", []any{"evalsha", "", 1, "", fingerprint, "", leaseMs}},
		{"complete", []any{"evalsha", "", 1, "", "", int64(0), fingerprint, "", int64(0)}},
	}
	var scripts [][]any
	for i, args := range cmds {
		if len(args) < 2 {
			continue
		}
		sha := ""
		switch args[0] {
		case "evalsha":
			sha, _ = plain(args[1]).(string)
		case "eval":
			src, _ := plain(args[1]).(string)
			sum := sha1.Sum([]byte(src))
			sha = hex.EncodeToString(sum[:])
		default:
			continue
		}
		if len(scripts) > 0 && sameShape(args, syncgen) {
			f.syncgenSHA = sha
			continue
		}
		if len(scripts) == len(shapes) {
			continue
		}
		want := shapes[len(scripts)]
		if !sameShape(args, want.want) || fmt.Sprint(plain(args[2])) != "1" {
			shape := make([]string, len(args))
			for i, a := range args {
				shape[i] = fmt.Sprintf("%T", a)
			}
			return fmt.Errorf("%w: the %s script call has an unexpected shape: %v", ErrCapture, want.name, shape)
		}
		if want.name == "complete" {
			// Do waited for complete.lua if its answer came before Do's.
			f.completeAsync = !answered[i]
		}
		args = append([]any{args[0], sha}, args[2:]...)
		scripts = append(scripts, args)
	}
	if len(scripts) != len(shapes) {
		return fmt.Errorf("%w: %d script calls among %d commands, want claim.lua and complete.lua", ErrCapture, len(scripts), len(cmds))
	}
	f.sha, _ = scripts[0][1].(string)
	f.completeSHA, _ = scripts[1][1].(string)
	f.completeBlob, _ = plain(scripts[1][7]).(string)
	f.completeTTL, _ = plain(scripts[1][8]).(int64)
	if f.completeBlob == "" || f.completeTTL <= 0 {
		return fmt.Errorf("%w: complete.lua cached no result (ttl %d)", ErrCapture, f.completeTTL)
	}
	for _, sha := range []string{f.sha, f.completeSHA, f.syncgenSHA} {
		if sha == "" {
			continue // no syncgen.lua
		}
		ok, err := f.e.rdb.ScriptExists(ctx, sha).Result()
		if err != nil || len(ok) != 1 || !ok[0] {
			return fmt.Errorf("%w: script %s not loaded: %v", ErrCapture, sha, err)
		}
	}
	return nil
}

// emptyWrite is the business write of every workload: none, and the result.
func emptyWrite(context.Context, pgx.Tx, claim.Op) (durable.Result, error) { return result, nil }

// fresh is the fresh-key floor: the library's BEGIN, the order INSERT,
// then its record INSERT and COMMIT in one pipeline, with pgx and nothing
// else: what Do sends PostgreSQL for a key Redis says is new.
func (f *floors) fresh(ctx context.Context, key string) (outcome, error) {
	return f.record(ctx, key, f.insertSQL)
}

// pkOnly is floor-sql without the record's secondary indexes and CHECK
// constraints: the library's statements, the record inserted into a copy
// of its table that has its primary key alone. Between it and floor-sql is
// what those indexes cost a fresh request.
func (f *floors) pkOnly(ctx context.Context, key string) (outcome, error) {
	return f.record(ctx, key, f.pkOnlySQL)
}

// record runs the library's BEGIN, the order INSERT, then insert (the
// library's record INSERT, into its table or another) with the arguments Do
// sends without Redis, and COMMIT.
func (f *floors) record(ctx context.Context, key, insert string) (outcome, error) {
	h := sha256.Sum256([]byte(key))
	return f.orderThenCommit(ctx, key, f.beginSQL, nil, insert,
		f.insertArgs(h[:], time.Now().Add(-30*time.Second).UnixMilli(), uuid.New())...)
}

// keyRow is the least a durable record in the business transaction can
// cost: the library's BEGIN, the order INSERT, then an INSERT of the key's
// 32-byte hash into a table with that as its primary key and nothing else,
// and COMMIT, the last two in one pipeline as Do sends them: floor-sql with
// only the record changed. Between it and
// floor-sql is what the library's record itself costs the database (its
// columns and indexes); between it and floor-business-tx, what any record
// written with the business write costs.
func (f *floors) keyRow(ctx context.Context, key string) (outcome, error) {
	h := sha256.Sum256([]byte(key))
	return f.orderThenCommit(ctx, key, f.beginSQL, nil, f.e.insertKeyRow, h[:])
}

// orderThenCommit runs begin, the order INSERT, then sql with args and
// COMMIT in one pipeline, on one connection; afterBegin, when set, once
// begin has returned.
func (f *floors) orderThenCommit(ctx context.Context, key, begin string, afterBegin func(), sql string, args ...any) (outcome, error) {
	conn, err := f.e.pool.Acquire(ctx)
	if err != nil {
		return oOther, err
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		return oOther, err
	}
	if afterBegin != nil {
		afterBegin()
	}
	if err := insertOrder(ctx, f.e, tx, key); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return oOther, err
	}
	if _, err := execWithCommit(ctx, conn, sql, args...); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return oOther, err
	}
	return oExecuted, nil
}

// execWithCommit sends sql with args and COMMIT in one pipeline on conn,
// whose transaction is open, and returns sql's command tag.
func execWithCommit(ctx context.Context, conn *pgxpool.Conn, sql string, args ...any) (pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue("commit")
	br := conn.SendBatch(ctx, b)
	done, err := br.Exec()
	var tag pgconn.CommandTag
	var cerr error
	if err == nil {
		tag, cerr = br.Exec()
	}
	if err := errors.Join(err, cerr, br.Close()); err != nil {
		return done, err
	}
	if tag.String() != "COMMIT" {
		return done, fmt.Errorf("%w: floor COMMIT answered %q", ErrUnexpected, tag)
	}
	return done, nil
}

// claimFirst is the claim-first protocol as its statements alone, with
// pgx: BEGIN, the claim (claimSQL, the full claim a Claim sends without
// Redis, or claimNew, the insert it sends for a key Redis granted; reading
// the generation it grants), the order INSERT, then the completion and
// COMMIT in one pipeline. Do's default until issue 44, now what Do sends
// for a key whose record exists unfinished (or on a store that cannot
// lock first), and the workflow's statements (Claim, the caller's
// transaction, Lease.Complete) in one transaction. Since issue 44 every
// claim statement also takes the key's advisory lock.
func (f *floors) claimFirst(ctx context.Context, claimSQL, key string) (outcome, error) {
	h := sha256.Sum256([]byte(key))
	owner := uuid.New()
	return f.claimThenComplete(ctx, key, f.beginSQL, func(tx pgx.Tx) (int64, error) {
		rows, err := tx.Query(ctx, claimSQL, f.claimArgs(h[:], owner)...)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		var gen int64
		if rows.Next() {
			v, err := rows.Values()
			if err != nil {
				return 0, err
			}
			gen, _ = v[0].(int64)
		}
		rows.Close()
		return gen, rows.Err()
	}, func(gen int64) (string, []any) { return f.finishSQL, f.finishArgs(h[:], gen, owner) })
}

// claimThenComplete runs begin (the library's BEGIN, or more in the same
// query), claim (which returns the generation it granted), the order
// INSERT, then the completion finish gives for that generation and COMMIT
// in one pipeline, on one connection.
func (f *floors) claimThenComplete(ctx context.Context, key, begin string, claim func(pgx.Tx) (int64, error), finish func(gen int64) (string, []any)) (outcome, error) {
	conn, err := f.e.pool.Acquire(ctx)
	if err != nil {
		return oOther, err
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		return oOther, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after COMMIT
	gen, err := claim(tx)
	if err != nil {
		return oOther, err
	}
	if gen == 0 {
		return oOther, fmt.Errorf("%w: the claim of a fresh key granted nothing", ErrUnexpected)
	}
	if err := insertOrder(ctx, f.e, tx, key); err != nil {
		return oOther, err
	}
	sql, args := finish(gen)
	done, err := execWithCommit(ctx, conn, sql, args...)
	if err != nil {
		return oOther, err
	}
	if done.RowsAffected() != 1 {
		return oOther, fmt.Errorf("%w: floor completion wrote %d rows", ErrUnexpected, done.RowsAffected())
	}
	return oExecuted, nil
}

// businessTx is the bare business transaction: BEGIN, the order INSERT,
// COMMIT, with pgx and no idempotency at all. It is what a service without
// oncekey pays for the same write.
func (f *floors) businessTx(ctx context.Context, key string) (outcome, error) {
	tx, err := f.e.pool.Begin(ctx)
	if err != nil {
		return oOther, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := insertOrder(ctx, f.e, tx, key); err != nil {
		return oOther, err
	}
	return oExecuted, tx.Commit(ctx)
}

// insertOrder is the business write, as the library's fn sends it.
func insertOrder(ctx context.Context, e *env, tx pgx.Tx, key string) error {
	tag, err := tx.Exec(ctx, e.insertOrder, key, orderAmount)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("%w: the order INSERT wrote %d rows", ErrUnexpected, tag.RowsAffected())
	}
	return nil
}

// evalsha is the Redis floor: one EVALSHA of claim.lua on the record's
// key, as the library sends it, with a fresh owner.
func (f *floors) evalsha(ctx context.Context, key string) (outcome, error) {
	return f.evalshaOn(ctx, f.e.rdb, key)
}

// evalshaOn is evalsha on client c.
func (f *floors) evalshaOn(ctx context.Context, c *redis.Client, key string) (outcome, error) {
	v, err := f.claimScript(ctx, c, fastpath.KeysFor(f.e.prefix, scope(key).Ref(nil)), uuid.New().String())
	if err != nil {
		return oOther, err
	}
	if len(v) > 0 {
		switch v[0] {
		case "acquired":
			return oAcquired, nil
		case "busy":
			return oBusy, nil
		case "cached":
			return oCached, nil
		}
	}
	return oOther, fmt.Errorf("%w: claim.lua answered %v", ErrUnexpected, v)
}

// claimScript is one EVALSHA of claim.lua on k's record for owner, as the
// library sends it, on client c.
func (f *floors) claimScript(ctx context.Context, c *redis.Client, k fastpath.Keys, owner string) ([]any, error) {
	return c.EvalSha(ctx, f.sha, []string{k.Record}, fingerprint, owner, leaseMs).Slice()
}

// claimNewRedis is floor-claim-new with the two script calls Do makes
// around it when Redis answers: claim.lua on the record's key (acquired,
// with a generation), the statements, then complete.lua with the result
// Do caches, dropping the lease. It is the floor of a fresh Do with Redis,
// the library's statements and scripts with no library code.
func (f *floors) claimNewRedis(ctx context.Context, key string) (outcome, error) {
	k := fastpath.KeysFor(f.e.prefix, scope(key).Ref(nil))
	owner := uuid.New().String()
	v, err := f.claimScript(ctx, f.e.rdb, k, owner)
	if err != nil {
		return oOther, err
	}
	if len(v) != 2 || v[0] != "acquired" {
		return oOther, fmt.Errorf("%w: claim.lua answered %v for a fresh key", ErrUnexpected, v)
	}
	if out, err := f.claimFirst(ctx, f.claimNew, key); err != nil {
		return out, err
	}
	r, err := f.e.rdb.EvalSha(ctx, f.completeSHA, []string{k.Record},
		owner, v[1], fingerprint, f.completeBlob, f.completeTTL).Slice()
	if err != nil {
		return oOther, err
	}
	if len(r) != 2 || r[0] != int64(1) || r[1] != int64(1) {
		return oOther, fmt.Errorf("%w: complete.lua answered %v, want the result cached and the lease dropped", ErrUnexpected, r)
	}
	return oExecuted, nil
}

// lockFirst is Do's default protocol on PostgreSQL since issue 44 (it
// locks first) as its statements alone, with pgx, without Redis, on the
// table of st: BEGIN with the key's lock and the check that no record
// exists in one round trip, the order INSERT, then the finished record's
// INSERT and COMMIT in one pipeline, at the generation Do proposes without
// Redis (the client's clock less 30 s). One row version, three round
// trips: the floor of fn once per record life with the lock.
func (f *floors) lockFirst(ctx context.Context, st *lockFirstStatements, key string) (outcome, error) {
	h := sha256.Sum256([]byte(key))
	gen := time.Now().Add(-30 * time.Second).UnixMilli()
	return f.orderThenCommit(ctx, key, st.begin.build(h[:], gen), nil, st.insert, f.insertArgs(h[:], gen, uuid.New())...)
}

// lockFirstRedis is floor-lock-first with the script calls Do makes when
// Redis answers, as captureScript saw Do make them: claim.lua on the
// record's key (acquired, with a generation), the statements at that
// generation, then complete.lua with the result Do caches, dropping the
// lease, waited for, or, when Do sent it after its answer, from a goroutine
// not waited for. When Do sent syncgen.lua (which confirmed the lease while
// fn ran), it is sent likewise from a goroutine once the BEGIN's round trip
// has returned, its answer not read. It is the floor of a fresh Do with
// Redis. A failed call that was not waited for fails the next request.
func (f *floors) lockFirstRedis(ctx context.Context, key string) (outcome, error) {
	if err := f.asyncErr.Swap(nil); err != nil {
		return oOther, *err
	}
	k := fastpath.KeysFor(f.e.prefix, scope(key).Ref(nil))
	owner := uuid.New()
	ownerText := owner.String()
	v, err := f.claimScript(ctx, f.e.rdb, k, ownerText)
	if err != nil {
		return oOther, err
	}
	if len(v) != 2 || v[0] != "acquired" {
		return oOther, fmt.Errorf("%w: claim.lua answered %v for a fresh key", ErrUnexpected, v)
	}
	gen, err := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	if err != nil || gen <= 0 {
		return oOther, fmt.Errorf("%w: claim.lua granted generation %v", ErrUnexpected, v[1])
	}
	var confirm func()
	if f.syncgenSHA != "" {
		confirm = func() {
			go func() {
				_ = f.e.rdb.EvalSha(context.WithoutCancel(ctx), f.syncgenSHA, []string{k.Record}, gen, ownerText).Err()
			}()
		}
	}
	h := sha256.Sum256([]byte(key))
	if out, err := f.orderThenCommit(ctx, key, f.locked.begin.build(h[:], gen), confirm, f.locked.insert,
		f.insertArgs(h[:], gen, owner)...); err != nil {
		return out, err
	}
	cache := func(ctx context.Context) error {
		r, err := f.e.rdb.EvalSha(ctx, f.completeSHA, []string{k.Record},
			ownerText, v[1], fingerprint, f.completeBlob, f.completeTTL).Slice()
		if err != nil {
			return err
		}
		if len(r) != 2 || r[0] != int64(1) || r[1] != int64(1) {
			return fmt.Errorf("%w: complete.lua answered %v, want the result cached and the lease dropped", ErrUnexpected, r)
		}
		return nil
	}
	if f.completeAsync {
		go func() {
			if err := cache(context.WithoutCancel(ctx)); err != nil {
				f.asyncErr.CompareAndSwap(nil, &err)
			}
		}()
		return oExecuted, nil
	}
	if err := cache(ctx); err != nil {
		return oOther, err
	}
	return oExecuted, nil
}

// selectRow is the database replay floor: one SELECT of the stored result.
func (f *floors) selectRow(ctx context.Context, key string) (outcome, error) {
	h := sha256.Sum256([]byte(key))
	rows, err := f.e.pool.Query(ctx, f.selectSQL, tenant, operation, h[:])
	if err != nil {
		return oOther, err
	}
	found := rows.Next() && rows.RawValues()[4] != nil // the body: set once completed
	rows.Close()
	if err := rows.Err(); err != nil {
		return oOther, err
	}
	if !found {
		return oOther, fmt.Errorf("%w: no completed row", ErrUnexpected)
	}
	return oRead, nil
}

// claimRow is the library's claim statement alone, on the pool, for a key
// that is already completed: what the statement itself costs a database
// replay, without the library around it.
func (f *floors) claimRow(ctx context.Context, key string) (outcome, error) {
	// The record the library wrote: its key hash and its operation digest,
	// which the statement names it by.
	ref := scope(key).Ref(nil)
	digest := ref.Digest()
	args := f.claimArgs(ref.KeyHash[:], uuid.New())
	args[len(args)-1] = digest[:]
	rows, err := f.e.pool.Query(ctx, f.claimSQL, args...)
	if err != nil {
		return oOther, err
	}
	var acquired, found bool
	if rows.Next() {
		raw := rows.RawValues()
		acquired = raw[0] != nil
		found = len(raw) > 3 && raw[3] != nil // the existing record's first column
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return oOther, err
	}
	if acquired || !found {
		return oOther, fmt.Errorf("%w: the claim statement did not return the completed record", ErrUnexpected)
	}
	return oRead, nil
}
