package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/headers"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// Complete stores res and moves the record to completed, fenced by tok: one
// UPDATE that matches the record's owner, generation and state (processing,
// or uncertain after Adopt). The record then expires at least its retention
// from now (by the database's clock), however late it finished. Completing
// again with the same token and result (headers compared byte for byte)
// succeeds. It returns ErrFenced when tok no longer holds the record. With
// a non-nil tx it runs inside tx.
func (s *store) Complete(ctx context.Context, tx *sql.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	return s.finishOn(ctx, tx, "complete", durable.Completed, ref, tok, res)
}

// Fail stores res as a final business rejection (state failed), fenced like
// Complete, inside tx when tx is not nil. Failing again with the same token
// and result succeeds.
func (s *store) Fail(ctx context.Context, tx *sql.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	return s.finishOn(ctx, tx, "fail", durable.Failed, ref, tok, res)
}

func (s *store) finishOn(ctx context.Context, tx *sql.Tx, op string, state durable.State, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if err := validWrite(op, ref, tok); err != nil {
		return err
	}
	jsonHeaders, err := encodeHeaders(res.Headers)
	if err != nil {
		return storeapi.Invalid("result", "headers cannot be encoded: "+err.Error())
	}
	body := res.Body
	if body == nil {
		body = []byte{} // a stored result always has a body, maybe empty
	}
	var resource sql.NullString
	if res.ResourceID != "" {
		resource = sql.NullString{String: res.ResourceID, Valid: true}
	}
	// A finished record with this token and this result: the write applied
	// (now or by an earlier call with the same token).
	applied := func(rec durable.Record) bool {
		return rec.State == state && heldBy(rec, tok) && sameResult(rec.Result, res)
	}
	return s.fencedWrite(ctx, tx, op, ref, applied, s.q.complete,
		ref.Tenant, ref.Operation, ref.KeyHash[:], tok.Owner.String(), int64(tok.Generation),
		string(state), int64(res.StatusCode), jsonHeaders, body, int64(res.Version), resource,
		headers.Encode(res.Headers))
}

// MarkUncertain moves a processing record to uncertain and frees its lease
// for the reconciler, fenced. Marking again with the same token succeeds
// while the record is still uncertain under it.
func (s *store) MarkUncertain(ctx context.Context, ref durable.Ref, tok fence.Token) error {
	if err := validWrite("mark uncertain", ref, tok); err != nil {
		return err
	}
	applied := func(rec durable.Record) bool {
		return rec.State == durable.Uncertain && heldBy(rec, tok)
	}
	return s.fencedWrite(ctx, nil, "mark uncertain", ref, applied, s.q.markUncertain,
		ref.Tenant, ref.Operation, ref.KeyHash[:], tok.Owner.String(), int64(tok.Generation))
}

// Renew extends the lease to lease from now by the database's clock,
// fenced; only a processing record, or an uncertain one adopted by tok, is
// renewed. Renewing an expired lease that no one took over succeeds: the
// token still holds the record.
func (s *store) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	if err := validWrite("renew", ref, tok); err != nil {
		return err
	}
	if err := validLease(lease); err != nil {
		return err
	}
	return s.fencedWrite(ctx, nil, "renew", ref, nil, s.q.renew,
		ref.Tenant, ref.Operation, ref.KeyHash[:], tok.Owner.String(), int64(tok.Generation), lease.Microseconds())
}

// Handover hands the processing record held by from to owner under
// generation from+1 and a lease of lease, in one statement: exactly one
// handover of a token succeeds; [durable.ErrFenced] when the record is not
// held by from.
func (s *store) Handover(ctx context.Context, ref durable.Ref, from fence.Token, owner uuid.UUID, lease time.Duration) (fence.Token, error) {
	if err := validWrite("handover", ref, from); err != nil {
		return fence.Token{}, err
	}
	if err := validLease(lease); err != nil {
		return fence.Token{}, err
	}
	if owner == uuid.Nil {
		return fence.Token{}, fmt.Errorf("durable/sqlite: handover: %w", storeapi.Invalid("owner", "nil UUID"))
	}
	unlock, err := s.lockWrites(ctx)
	if err != nil {
		return fence.Token{}, unavailable("handover", err)
	}
	defer unlock()
	var gen int64
	err = s.queryRow(ctx, s.db, s.q.handover, ref.Tenant, ref.Operation, ref.KeyHash[:], from.Owner.String(),
		int64(from.Generation), owner.String(), lease.Microseconds()).Scan(&gen)
	if errors.Is(err, sql.ErrNoRows) {
		return fence.Token{}, fmt.Errorf("durable/sqlite: handover: %w", durable.ErrFenced)
	}
	if err != nil {
		return fence.Token{}, translate("handover", err)
	}
	return fence.Token{Generation: uint64(gen), Owner: owner}, nil
}

// Release frees a processing record for any new claim, fenced, or an
// uncertain one adopted under tok (the Reconciler's resolve said nothing
// happened); the row and its generation are kept, so the next claim gets a
// higher generation.
// Releasing again with the same token succeeds while no one claimed it since.
// With a non-nil tx it runs inside tx.
func (s *store) Release(ctx context.Context, tx *sql.Tx, ref durable.Ref, tok fence.Token) error {
	return s.releaseOn(ctx, tx, ref, tok)
}

func (s *store) releaseOn(ctx context.Context, tx *sql.Tx, ref durable.Ref, tok fence.Token) error {
	if err := validWrite("release", ref, tok); err != nil {
		return err
	}
	// Released under this generation: only this token can have done it,
	// since any later claim raises the generation.
	applied := func(rec durable.Record) bool {
		return rec.Released && rec.Token.Generation == tok.Generation
	}
	return s.fencedWrite(ctx, tx, "release", ref, applied, s.q.release,
		ref.Tenant, ref.Operation, ref.KeyHash[:], tok.Owner.String(), int64(tok.Generation))
}

// fencedWrite runs one fenced UPDATE on tx, or on the database under the
// Store's write lock when tx is nil. When it matches no row, or fails, the
// record is re-read: applied(record) true means the write is in place (a
// retried call, or an outcome that applied although an error came back) and
// is success. Otherwise zero rows is ErrFenced and an error is returned as
// it is. applied nil means the write cannot be recognized afterwards.
func (s *store) fencedWrite(ctx context.Context, tx *sql.Tx, op string, ref durable.Ref,
	applied func(durable.Record) bool, query string, args ...any) error {
	var q querier = tx
	if tx == nil {
		unlock, err := s.lockWrites(ctx)
		if err != nil {
			return unavailable(op, err)
		}
		defer unlock()
		q = s.db
	}
	n, werr := s.rowsAffected(s.exec(ctx, q, query, args...))
	if werr == nil && n == 1 {
		return nil
	}
	if applied != nil {
		rec, err := s.reread(ctx, tx, q, ref)
		if err == nil && applied(rec) {
			return nil
		}
		if werr == nil && err != nil && !errors.Is(err, sql.ErrNoRows) {
			return translate(op, err) // cannot tell: report that, not a guess
		}
	}
	if werr != nil {
		return translate(op, werr)
	}
	return fmt.Errorf("durable/sqlite: %s: %w", op, durable.ErrFenced)
}

// reread reads ref after a fenced write that failed or matched nothing. On
// its own (tx nil) it runs on a context detached from ctx and bounded by
// resolveTimeout: a caller whose ctx was cancelled, perhaps what failed the
// write, still learns the truth. Inside tx it runs in tx, whose outcome the
// caller's COMMIT decides.
func (s *store) reread(ctx context.Context, tx *sql.Tx, q querier, ref durable.Ref) (durable.Record, error) {
	if tx != nil {
		return s.get(ctx, q, ref)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	return s.get(rctx, q, ref)
}

// resolveTimeout bounds a re-read that resolves the outcome of a fenced write.
const resolveTimeout = 5 * time.Second

func (s *store) rowsAffected(r sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func validWrite(op string, ref durable.Ref, tok fence.Token) error {
	if err := validRef(ref); err != nil {
		return err
	}
	return validToken(op, tok)
}
