package main

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	e          *env
	beginSQL   string         // the library's BEGIN (with its SET LOCALs)
	claimSQL   string         // the durable claim: INSERT ... ON CONFLICT ... RETURNING
	claimNew   string         // the claim of a key Redis granted: INSERT ... ON CONFLICT DO NOTHING
	slim       slimStatements // on the slim record with slimHotIndexes
	slimPend   slimStatements // on the slim record with slimPendingIndexes
	finishSQL  string         // the fenced completion: UPDATE ... SET state = 'completed'
	insertSQL  string         // Do's record, inserted finished with the COMMIT
	pkOnlySQL  string         // insertSQL into the record's table with its primary key alone
	selectSQL  string         // a bare read of a stored result
	sha        string         // claim.lua's SHA1
	headers    string         // result.Headers as JSON text, encoded once (the store sends it as text)
	binHeaders []byte         // result.Headers in the store's byte-exact encoding, captured

	// complete.lua's SHA1, and the result and TTL Do cached with it
	completeSHA  string
	completeBlob string
	completeTTL  int64
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
// the claim statement of one Claim. It checks that Do sent
// BEGIN, the order INSERT, then the record INSERT with COMMIT, as the floor
// sends them.
func (f *floors) captureSQL(ctx context.Context) error {
	h := make([]byte, 32)
	err := f.captureDo(ctx, f.e.atCommit, "begin,order,record,commit", func(i int, s pgx.TraceQueryStartData) string {
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
		if isClaimSQL(s.SQL) && sameShape(f.claimArgs(h, uuid.Nil), s.Args) {
			f.claimSQL = s.SQL
		}
	}
	if f.claimSQL == "" {
		return fmt.Errorf("%w: no claim statement of the expected shape among %d statements", ErrCapture, len(stmts))
	}
	if err := f.captureClaimFirst(ctx); err != nil {
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

// captureClaimFirst records one Do without Redis, claiming first (the
// default), checks it sent BEGIN, the claim, the order INSERT, the
// completion and COMMIT, and keeps the completion.
func (f *floors) captureClaimFirst(ctx context.Context) error {
	h := make([]byte, 32)
	return f.captureDo(ctx, f.e.noRedis, "begin,claim,order,complete,commit", func(i int, s pgx.TraceQueryStartData) string {
		switch {
		case i == 0 && s.SQL == f.beginSQL:
			return "begin"
		case s.SQL == f.claimSQL:
			return "claim"
		case strings.Contains(s.SQL, "SET state = 'completed'") && sameShape(f.finishArgs(h, 1, uuid.Nil), s.Args):
			f.finishSQL = s.SQL
			return "complete"
		}
		return ""
	})
}

// captureClaimNew records one Do with Redis, which claims a key Redis
// granted with the insert alone (ClaimParams.ExpectNew), checks it sent
// BEGIN, that insert, the order INSERT, the completion and COMMIT, and keeps
// the insert.
func (f *floors) captureClaimNew(ctx context.Context) error {
	h := make([]byte, 32)
	return f.captureDo(ctx, f.e.withRedis, "begin,claim,order,complete,commit", func(i int, s pgx.TraceQueryStartData) string {
		switch {
		case i == 0 && s.SQL == f.beginSQL:
			return "begin"
		case isClaimSQL(s.SQL) && strings.Contains(s.SQL, "DO NOTHING") && sameShape(f.claimArgs(h, uuid.Nil), s.Args):
			f.claimNew = s.SQL
			return "claim"
		case s.SQL == f.finishSQL:
			return "complete"
		}
		return ""
	})
}

// captureDo records the statements of one Do of the fresh workload on c,
// names each with kind (which keeps what it needs; "" for none of its
// own), and checks the names read want. The order INSERT and COMMIT are
// named here.
func (f *floors) captureDo(ctx context.Context, c *claim.Claimer[pgx.Tx], want string, kind func(i int, s pgx.TraceQueryStartData) string) error {
	stmts, err := f.e.sql.capture(func() error {
		_, err := doOrder(ctx, f.e, c, randName("capture-"))
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: Do: %w", ErrCapture, err)
	}
	shape := make([]string, len(stmts))
	for i, s := range stmts {
		switch shape[i] = kind(i, s); {
		case shape[i] != "":
		case s.SQL == f.e.insertOrder:
			shape[i] = "order"
		case strings.EqualFold(s.SQL, "commit"):
			shape[i] = "commit"
		default:
			shape[i] = "other"
		}
	}
	if got := strings.Join(shape, ","); got != want {
		return fmt.Errorf("%w: Do sent %s; want %s", ErrCapture, got, want)
	}
	return nil
}

// captureScript records the Redis commands of one Do on the Redis Claimer
// and keeps the SHA of the first script it ran (claim.lua) and, from the
// second (complete.lua), its SHA and the cached result it wrote. The
// syncgen.lua call that confirms Do's tentative lease (sent off the
// caller's path, concurrently with fn, since issue 43.1) is recognised by
// its shape and passed over: the floors do not send it.
func (f *floors) captureScript(ctx context.Context) error {
	cmds, err := f.e.rc.capture(func() error {
		_, err := f.e.withRedis.Do(ctx, request(randName("capture-")), emptyWrite)
		return err
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
	// syncgen.lua: the key; generation, owner.
	syncgen := []any{"evalsha", "", 1, "", int64(0), ""}
	var scripts [][]any
	for _, args := range cmds {
		if len(args) < 2 || len(scripts) == len(shapes) {
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
	for _, sha := range []string{f.sha, f.completeSHA} {
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
	return f.orderThenCommit(ctx, key, f.beginSQL, insert,
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
	return f.orderThenCommit(ctx, key, f.beginSQL, f.e.insertKeyRow, h[:])
}

// orderThenCommit runs begin, the order INSERT, then sql with args and
// COMMIT in one pipeline, on one connection.
func (f *floors) orderThenCommit(ctx context.Context, key, begin, sql string, args ...any) (outcome, error) {
	conn, err := f.e.pool.Acquire(ctx)
	if err != nil {
		return oOther, err
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		return oOther, err
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

// claimFirst is Do's protocol when it claims first (its default) as its
// statements alone, with pgx: BEGIN, the claim (claimSQL, Do's without
// Redis, or claimNew, Do's when Redis granted the key; reading the
// generation it grants), the order INSERT, then the completion and COMMIT
// in one pipeline. It is the floor of running fn once per record life on
// today's record.
func (f *floors) claimFirst(ctx context.Context, claimSQL, key string) (outcome, error) {
	return f.claimFirstOn(ctx, claimSQL, f.finishSQL, key)
}

// onDigestKey is sql (one of the library's statements) on the digest-keyed
// table instead of the store's.
func (f *floors) onDigestKey(sql string) string {
	return strings.ReplaceAll(sql, f.e.table+" ", f.e.digestKeyTable+" ")
}

// claimFirstOn is claimFirst with the completion finishSQL.
func (f *floors) claimFirstOn(ctx context.Context, claimSQL, finishSQL, key string) (outcome, error) {
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
	}, func(gen int64) (string, []any) { return finishSQL, f.finishArgs(h[:], gen, owner) })
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
