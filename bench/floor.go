package main

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
	retentionMs = benchRetention.Milliseconds()
)

// floors are the library-free ways of doing what a workload does: the
// library's own statements and script, captured from it at start-up so the
// floors cannot drift from what they are compared to.
type floors struct {
	e           *env
	beginSQL    string // the library's BEGIN (with its SET LOCALs)
	claimSQL    string // the durable claim: INSERT ... ON CONFLICT ... RETURNING
	completeSQL string // the fenced completion UPDATE
	selectSQL   string // a bare read of a stored result
	sha         string // claim.lua's SHA1
	headers     []byte // result.Headers as JSON, encoded once
	binHeaders  []byte // result.Headers in the store's byte-exact encoding, captured
}

func newFloors(ctx context.Context, e *env) (*floors, error) {
	f := &floors{e: e}
	var err error
	if f.headers, err = json.Marshal(result.Headers); err != nil {
		return nil, err
	}
	if err := f.captureSQL(ctx); err != nil {
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

func (f *floors) completeArgs(h []byte, gen int64, owner uuid.UUID) []any {
	return []any{tenant, operation, h, gen, pgUUID(owner), result.StatusCode, f.headers, result.Body, result.Version, result.ResourceID, f.binHeaders}
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
// business write) on the PostgreSQL-only Claimer and keeps its BEGIN, claim
// and completion. It checks that the order INSERT came between the claim
// and the completion, as the floor sends it.
func (f *floors) captureSQL(ctx context.Context) error {
	key := randName("capture-")
	stmts, err := f.e.sql.capture(func() error {
		_, err := doOrder(ctx, f.e, f.e.noRedis, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: Do: %w", ErrCapture, err)
	}
	h := make([]byte, 32)
	claimAt, insertAt, completeAt := -1, -1, -1
	for i, s := range stmts {
		switch {
		case i == 0 && strings.HasPrefix(strings.ToLower(s.SQL), "begin"):
			f.beginSQL = s.SQL
		case isClaimSQL(s.SQL) && sameShape(f.claimArgs(h, uuid.Nil), s.Args):
			f.claimSQL, claimAt = s.SQL, i
		case s.SQL == f.e.insertOrder:
			insertAt = i
		case !isClaimSQL(s.SQL) && strings.Contains(s.SQL, "UPDATE") && strings.Contains(s.SQL, "'completed'") &&
			len(s.Args) > 0 && sameShape(f.completeArgs(h, 1, uuid.Nil)[:len(s.Args)-1], s.Args[:len(s.Args)-1]):
			// The last argument is the byte-exact header encoding of the
			// (constant) result: the floor sends the library's own bytes.
			f.completeSQL, completeAt = s.SQL, i
			f.binHeaders, _ = s.Args[len(s.Args)-1].([]byte)
		}
	}
	if f.beginSQL == "" || f.claimSQL == "" || f.completeSQL == "" {
		return fmt.Errorf("%w: no BEGIN, claim and completion of the expected shape among %d statements", ErrCapture, len(stmts))
	}
	if claimAt >= insertAt || insertAt >= completeAt {
		return fmt.Errorf("%w: the business INSERT is not between the claim and the completion (statements %d, %d, %d)",
			ErrCapture, claimAt, insertAt, completeAt)
	}
	return nil
}

// captureScript records the Redis commands of one Do on the Redis Claimer
// and keeps the SHA of the first script it ran (claim.lua).
func (f *floors) captureScript(ctx context.Context) error {
	cmds, err := f.e.rc.capture(func() error {
		_, err := f.e.withRedis.Do(ctx, request(randName("capture-")), emptyWrite)
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: Do: %w", ErrCapture, err)
	}
	want := []any{"evalsha", "", 3, "", "", "", fingerprint, "", leaseMs, retentionMs}
	for _, args := range cmds {
		if len(args) < 2 {
			continue
		}
		switch args[0] {
		case "evalsha":
			f.sha, _ = plain(args[1]).(string)
		case "eval":
			src, _ := plain(args[1]).(string)
			sum := sha1.Sum([]byte(src))
			f.sha = hex.EncodeToString(sum[:])
		default:
			continue
		}
		if !sameShape(args, want) || fmt.Sprint(plain(args[2])) != "3" {
			shape := make([]string, len(args))
			for i, a := range args {
				shape[i] = fmt.Sprintf("%T", a)
			}
			return fmt.Errorf("%w: the first script call has an unexpected shape: %v", ErrCapture, shape)
		}
		break
	}
	if f.sha == "" {
		return fmt.Errorf("%w: no script call among %d commands", ErrCapture, len(cmds))
	}
	ok, err := f.e.rdb.ScriptExists(ctx, f.sha).Result()
	if err != nil || len(ok) != 1 || !ok[0] {
		return fmt.Errorf("%w: script %s not loaded: %v", ErrCapture, f.sha, err)
	}
	return nil
}

// emptyWrite is the business write of every workload: none, and the result.
func emptyWrite(context.Context, pgx.Tx, claim.Op) (durable.Result, error) { return result, nil }

// fresh is the fresh-key floor: the library's BEGIN, the claim, the order
// INSERT, the completion, COMMIT, with pgx and nothing else. The completion
// is fenced by the generation the claim returned (the database clock's
// floor, as for the library).
func (f *floors) fresh(ctx context.Context, key string) (outcome, error) {
	h := sha256.Sum256([]byte(key))
	owner := uuid.New()
	tx, err := f.e.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: f.beginSQL})
	if err != nil {
		return oOther, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, f.claimSQL, f.claimArgs(h[:], owner)...)
	if err != nil {
		return oOther, err
	}
	var gen int64 // the generation column: set when claimed
	acquired := false
	if rows.Next() {
		// Decode the first column alone, as the library's scan of it costs:
		// int8 in pgx's binary format.
		if raw := rows.RawValues()[0]; len(raw) == 8 {
			gen, acquired = int64(binary.BigEndian.Uint64(raw)), true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return oOther, err
	}
	if !acquired {
		return oOther, fmt.Errorf("%w: floor claim did not acquire a fresh key", ErrUnexpected)
	}
	if err := insertOrder(ctx, f.e, tx, key); err != nil {
		return oOther, err
	}
	tag, err := tx.Exec(ctx, f.completeSQL, f.completeArgs(h[:], gen, owner)...)
	if err != nil {
		return oOther, err
	}
	if tag.RowsAffected() != 1 {
		return oOther, fmt.Errorf("%w: floor completion updated %d rows", ErrUnexpected, tag.RowsAffected())
	}
	return oExecuted, tx.Commit(ctx)
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

// evalsha is the Redis floor: one EVALSHA of claim.lua on the key's three
// keys, as the library sends it, with a fresh owner.
func (f *floors) evalsha(ctx context.Context, key string) (outcome, error) {
	k := fastpath.KeysFor(f.e.prefix, scope(key).Ref(nil))
	v, err := f.e.rdb.EvalSha(ctx, f.sha, []string{k.Lease, k.Gen, k.Result},
		fingerprint, uuid.New().String(), leaseMs, retentionMs).Slice()
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
	h := sha256.Sum256([]byte(key))
	rows, err := f.e.pool.Query(ctx, f.claimSQL, f.claimArgs(h[:], uuid.New())...)
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
