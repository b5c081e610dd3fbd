package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// fencedWrite is one UPDATE matching the record's owner AND generation AND
// expected state.
type fencedWrite struct {
	op   string
	sql  string
	args []any
	// applied reports whether rec shows this write in effect for tok: a
	// repeated write, or one whose acknowledgement was lost, then succeeds.
	applied func(rec durable.Record) bool
	// notApplied reports whether rec, read after a lost reply and still at
	// tok's generation (held by tok, or released at it), proves that this
	// write did not apply: no sequence of writes after it could have led
	// to rec.
	notApplied func(rec durable.Record) bool
}

// run executes w and resolves every outcome to the truth:
//
//   - one row updated: success;
//   - zero rows: the write did not apply now. The record is read; if it
//     shows the write already in effect for tok, success (the same write
//     repeated), else ErrFenced;
//   - a failure that may have applied (connection lost after sending, on the
//     pool): the record is re-read (see resolve).
func (s *store) run(ctx context.Context, q querier, ref durable.Ref, tok fence.Token, w fencedWrite) error {
	n, err := s.exec(ctx, q, w.sql, w.args)
	switch {
	case err == nil && n == 1:
		return nil
	case err == nil:
		rec, gerr := s.get(ctx, q, ref)
		if errors.Is(gerr, durable.ErrNotFound) {
			return fencedErr(w.op)
		}
		if gerr != nil {
			return translate(w.op, gerr)
		}
		if w.applied(rec) {
			return nil
		}
		return fencedErr(w.op)
	case !s.onPool(q) || !isAmbiguous(err):
		return translate(w.op, err)
	}
	return s.resolve(ctx, ref, tok, w, err)
}

// resolve learns the outcome of w, whose reply was lost (cause), by
// re-reading the record on a context detached from the caller's (the
// caller's may be what cut the reply). ErrFenced means "this write did not
// apply", so it is returned only when the record proves that:
//
//   - in effect for tok (w.applied): success;
//   - tok can never have held the record: its generation is below tok's,
//     or equal with another owner (the store issues a generation once per
//     record): ErrFenced;
//   - at tok's generation and w.notApplied: still held by tok and
//     unfinished, ErrUnavailable (the write did not apply; retry it);
//     otherwise ErrFenced;
//   - anything else (a newer owner, the record gone, a state the write may
//     have led to): the write may have applied and been followed by other
//     writes (a Release then a new claim, a MarkUncertain then an
//     adoption), so the outcome is unknown: ErrUnavailable.
func (s *store) resolve(ctx context.Context, ref durable.Ref, tok fence.Token, w fencedWrite, cause error) error {
	rctx, cancel := detached(ctx)
	defer cancel()
	rec, gerr := s.get(rctx, s.pool, ref)
	if gerr != nil {
		return unavailable(w.op+" (outcome unknown: its reply was lost and the record could not be read)", cause)
	}
	g := rec.Token.Generation
	switch {
	case w.applied(rec):
		return nil
	case g < tok.Generation, g == tok.Generation && !rec.Released && rec.Token.Owner != tok.Owner:
		return fencedErr(w.op)
	case g == tok.Generation && w.notApplied(rec):
		if rec.Token == tok && !rec.State.Finished() {
			return unavailable(w.op+" (not in effect after a lost reply; retry)", cause)
		}
		return fencedErr(w.op)
	}
	return unavailable(w.op+" (outcome unknown: its reply was lost and the record moved on since)", cause)
}

// resolveTimeout bounds a re-read that resolves an ambiguous outcome.
const resolveTimeout = 5 * time.Second

// detached returns a context for the re-read that resolves an ambiguous
// outcome: not cancelled with ctx (a client that went away must not leave a
// claim unresolved, blocking the key for a lease), bounded by
// resolveTimeout, as the rollback and commit paths of InTx are.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
}

func fenceArgs(ref durable.Ref, tok fence.Token, more ...any) []any {
	return append(append(keyArgs(ref), int64(tok.Generation), pgUUID(tok.Owner)), more...)
}

func (s *store) finish(ctx context.Context, q querier, op string, state durable.State, ref durable.Ref, tok fence.Token, res durable.Result) error {
	bin, jsonHeaders, body, err := encodeResult(res)
	if err != nil {
		return fmt.Errorf("durable/postgres: %s: %w", op, err)
	}
	sql := s.q.complete
	if state == durable.Failed {
		sql = s.q.fail
	}
	return s.run(ctx, q, ref, tok, fencedWrite{
		op:   op,
		sql:  sql,
		args: fenceArgs(ref, tok, res.StatusCode, jsonHeaders, body, res.Version, res.ResourceID, bin),
		applied: func(rec durable.Record) bool {
			return rec.State == state && rec.Token == tok && sameResult(rec.Result, res)
		},
		// At tok's generation a finish is final: unfinished under tok, or
		// finished otherwise, or released (a finished record is never
		// released), the write did not apply.
		notApplied: func(durable.Record) bool { return true },
	})
}

// Complete stores res and moves the record to completed, fenced by tok: it
// applies only while tok is the record's token and the record is processing
// or uncertain. The record then expires at least its retention from now
// (by the database's clock), however late it finished. Completing again with
// the same token and result (headers compared byte for byte) succeeds;
// otherwise a write that no longer holds the record returns an error
// matching [durable.ErrFenced] and changes nothing. When the connection is
// lost after the UPDATE was sent, Complete re-reads the record and reports
// the truth (see the package documentation); if the record moved on since
// (a newer owner), the outcome is unknown: an error matching
// [durable.ErrUnavailable]. One round trip.
//
// With a non-nil tx it runs inside tx and commits with it; nothing is
// re-read then (the caller's COMMIT decides).
func (s *store) Complete(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	return s.finish(ctx, s.on(tx), "complete", durable.Completed, ref, tok, res)
}

// Fail stores res as a final business rejection (state failed), fenced
// like Complete, inside tx when tx is not nil.
func (s *store) Fail(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	return s.finish(ctx, s.on(tx), "fail", durable.Failed, ref, tok, res)
}

// MarkUncertain moves a processing record held by tok to uncertain and
// clears its lease, so the reconciler can Adopt it. The token stays
// the record's until then (its owner may still Complete or Fail it).
// Marking again with the same token succeeds; [durable.ErrFenced] otherwise.
// When its reply is lost and the record was adopted since, the mark may
// have applied before the adoption: the outcome is unknown, an error
// matching [durable.ErrUnavailable], never ErrFenced.
func (s *store) MarkUncertain(ctx context.Context, ref durable.Ref, tok fence.Token) error {
	return s.run(ctx, s.pool, ref, tok, fencedWrite{
		op:   "mark uncertain",
		sql:  s.q.markUncertain,
		args: fenceArgs(ref, tok),
		applied: func(rec durable.Record) bool {
			return rec.State == durable.Uncertain && rec.Token == tok
		},
		// Processing under tok, or released (only a processing record is
		// released): not marked. Finished under tok: it may have been
		// marked, then completed by tok.
		notApplied: func(rec durable.Record) bool { return !rec.State.Finished() },
	})
}

// Renew sets the lease of the record held by tok to lease from now by the
// database's clock. Only a processing record, or an uncertain one adopted
// by tok, is renewed; [durable.ErrFenced] otherwise. A lease that expired
// is renewed too as long as nobody took the record over: the token, not
// the clock, decides who may write. lease must be at least 1ms
// ([durable.ErrInvalidScope]).
func (s *store) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	if lease < time.Millisecond {
		return fmt.Errorf("durable/postgres: renew: %w", storeapi.Invalid("lease", "shorter than 1ms"))
	}
	return s.run(ctx, s.pool, ref, tok, fencedWrite{
		op:         "renew",
		sql:        s.q.renew,
		args:       fenceArgs(ref, tok, lease.Microseconds()),
		applied:    func(durable.Record) bool { return false }, // a renewal is repeated, not inferred
		notApplied: func(durable.Record) bool { return false },
	})
}

// Release frees a processing record held by tok for any new claim, or an
// uncertain one tok adopted (the Reconciler's resolve said nothing
// happened; MarkUncertain's own token cannot): the row
// stays (processing, no owner, no lease) so its generation survives, and
// the next claim, with any fingerprint, starts a new operation above it.
// Releasing again with the same token succeeds while nobody claimed the
// record since; [durable.ErrFenced] otherwise. When its reply is lost and
// the record was claimed since, the release may have applied before that
// claim: the outcome is unknown, an error matching [durable.ErrUnavailable],
// never ErrFenced. With a non-nil tx it runs inside tx.
func (s *store) Release(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token) error {
	return s.run(ctx, s.on(tx), ref, tok, fencedWrite{
		op:   "release",
		sql:  s.q.release,
		args: fenceArgs(ref, tok),
		applied: func(rec durable.Record) bool {
			// The database issues each generation of a row once, so a
			// released row at tok's generation was released by tok.
			return rec.Released && rec.Token.Generation == tok.Generation
		},
		// Still owned by tok (processing, uncertain or finished): a
		// released record never gets its owner back at the same
		// generation.
		notApplied: func(rec durable.Record) bool { return !rec.Released },
	})
}

// Adopt takes over, for the reconciler, a record that is uncertain with its
// lease free (never adopted, or the adopter's lease expired) or processing
// with an expired lease, under owner with a lease of lease. The state is
// kept; the generation becomes GREATEST(proposed, stored+1) and the
// record's takeovers count rises. It returns the new token, an error
// matching [durable.ErrNotFound] when there is no record, [durable.ErrBusy]
// when it is held by a live lease, released or finished, and
// [durable.ErrInvalidScope] for a nil owner, a lease under 1ms or a proposal
// out of range. A lost connection is resolved by re-reading, as for Claim.
func (s *store) Adopt(ctx context.Context, ref durable.Ref, owner uuid.UUID, proposed uint64, lease time.Duration) (fence.Token, error) {
	switch {
	case owner == uuid.Nil:
		return fence.Token{}, fmt.Errorf("durable/postgres: adopt: %w", storeapi.Invalid("owner", "nil UUID"))
	case lease < time.Millisecond:
		return fence.Token{}, fmt.Errorf("durable/postgres: adopt: %w", storeapi.Invalid("lease", "shorter than 1ms"))
	case proposed > 1<<62:
		return fence.Token{}, fmt.Errorf("durable/postgres: adopt: %w", storeapi.Invalid("proposed", "generation out of range"))
	}
	var (
		gen   *int64
		exist bool
	)
	args := append(keyArgs(ref), int64(proposed), pgUUID(owner), lease.Microseconds())
	if err := s.queryRow(ctx, s.pool, s.q.adopt, args, &gen, &exist); err != nil {
		if isAmbiguous(err) {
			rctx, cancel := detached(ctx)
			rec, gerr := s.get(rctx, s.pool, ref)
			cancel()
			if gerr == nil && rec.Token.Owner == owner && !rec.Released {
				return rec.Token, nil
			}
		}
		return fence.Token{}, translate("adopt", err)
	}
	switch {
	case gen != nil:
		return fence.Token{Generation: uint64(*gen), Owner: owner}, nil
	case !exist:
		return fence.Token{}, fmt.Errorf("durable/postgres: adopt: %w", durable.ErrNotFound)
	}
	return fence.Token{}, fmt.Errorf("durable/postgres: adopt: %w", durable.ErrBusy)
}
