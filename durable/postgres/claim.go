package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// Claim atomically inserts or takes over the record of p.Scope (see the
// durable package documentation for the rule) in one statement, on the
// pool. It returns:
//
//   - Acquired with the database's token (its generation may differ from
//     p.Proposed) when this claim now holds the key;
//   - the existing record otherwise: finished (replay its result),
//     processing with a live lease, or uncertain;
//   - that record and an error matching [durable.ErrMismatch] when it
//     belongs to another request fingerprint;
//   - [durable.ErrInvalidScope] for invalid parameters (nothing written);
//   - [durable.ErrUnavailable] when the database cannot be reached. When the
//     connection was lost after the claim was sent, Claim re-reads the
//     record and reports the truth instead (acquired if the row is held by
//     p.Owner), so an ambiguous claim is resolved, not guessed. That read
//     runs on a context detached from ctx and bounded to 5 s: a caller whose
//     ctx was cancelled mid-claim still learns that it holds the key (and
//     should release or complete it). Only if that read fails too is the
//     outcome unknown (then a row held by p.Owner may exist, and its lease
//     expires).
//
// It takes one round trip, two when the conflicting row was committed after
// the statement started (the row is then read again). With p.ExpectNew, it
// sends an insert first (claimNewSQL), which alone claims a scope with no
// record; a scope with one costs that one round trip more. ctx bounds the round
// trip; the lease is governed by p.Lease, measured by the database's clock.
//
// With a non-nil tx, which must be READ COMMITTED (as the store's InTx
// begins it), the claim runs inside tx: the claimed, taken over or classified
// row stays locked until tx ends, so a concurrent claimer of the same scope
// waits (bounded by lock_timeout) and then sees the committed outcome; a
// rollback leaves the record as it was. An ambiguous failure is not re-read
// then: the transaction is lost and the caller's COMMIT will report it.
//
// With p.NoLockUnlessAcquired and a non-nil tx, a claim that does not acquire
// leaves no lock in tx: the claim runs under a savepoint sent in the same
// round trip, and the store rolls back to it (one more round trip) when the
// claim did not acquire. Otherwise the row the statement refused stays
// locked until tx ends (ON CONFLICT DO UPDATE locks the conflicting row
// whatever its WHERE says; cur reads it FOR SHARE), which blocks the
// record's holder from finishing it for as long as tx stays open.
func (s *store) Claim(ctx context.Context, tx pgx.Tx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	if tx != nil {
		if p.NoLockUnlessAcquired {
			return s.claimUnlocked(ctx, tx, p)
		}
		return s.claim(ctx, tx, p)
	}
	return s.claim(ctx, s.pool, p)
}

// claimSavepoint names the savepoint of a claim with NoLockUnlessAcquired.
// Savepoints of one name stack: ROLLBACK TO names the latest, so two such
// claims in one transaction each roll back to their own.
const claimSavepoint = "oncekey_claim"

// claimUnlocked is the claim inside tx under a savepoint, rolled back to
// when the claim did not acquire: that releases every row lock the claim
// took (ROLLBACK TO SAVEPOINT ends the subtransaction that holds them) and
// keeps the record it read. An error leaves tx as the claim left it (the
// caller rolls tx back).
func (s *store) claimUnlocked(ctx context.Context, tx pgx.Tx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	if err := p.Validate(); err != nil {
		return storeapi.ClaimResult{}, fmt.Errorf("durable/postgres: claim: %w", err)
	}
	res, err := s.claim(ctx, &savepointFirst{Tx: tx}, p)
	if res.Acquired || (err != nil && !errors.Is(err, durable.ErrMismatch)) {
		return res, err
	}
	if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+claimSavepoint); rerr != nil {
		return res, translate("claim (rollback to savepoint)", rerr)
	}
	return res, err
}

// savepointFirst is tx whose first QueryRow is sent in one batch after a
// SAVEPOINT (one round trip for both).
type savepointFirst struct {
	pgx.Tx
	sent bool
}

func (q *savepointFirst) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if q.sent {
		return q.Tx.QueryRow(ctx, sql, args...)
	}
	q.sent = true
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + claimSavepoint)
	b.Queue(sql, args...)
	return &batchRow{br: q.Tx.SendBatch(ctx, b)}
}

// batchRow is the row of a batch's second statement, the first being one
// without rows; Scan closes the batch.
type batchRow struct{ br pgx.BatchResults }

func (r *batchRow) Scan(dest ...any) error {
	_, err := r.br.Exec()
	if err == nil {
		err = r.br.QueryRow().Scan(dest...)
	}
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

func (s *store) claim(ctx context.Context, q querier, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	if err := p.Validate(); err != nil {
		return storeapi.ClaimResult{}, fmt.Errorf("durable/postgres: claim: %w", err)
	}
	ref := p.Scope.Ref(s.cfg.secret)
	res := storeapi.ClaimResult{Ref: ref}
	h, digest := ref.KeyHash, ref.Digest()
	args := []any{ref.Tenant, ref.Operation, h[:], p.Fingerprint, int64(p.Proposed), pgUUID(p.Owner),
		p.Lease.Microseconds(), p.Retention.Microseconds(), digest[:]}
	for range 3 {
		// A key Redis has just granted most likely has no record: the
		// cheaper insert alone claims it (claimNewSQL says why it comes
		// first).
		var fresh int64
		switch err := s.claimNew(ctx, q, p, args, &fresh); {
		case err == nil:
			res.Acquired = true
			res.Token = fence.Token{Generation: uint64(fresh), Owner: p.Owner}
			return res, nil
		case errors.Is(err, pgx.ErrNoRows):
			// No hint, or the scope has a record: the full claim decides.
		case s.onPool(q) && isAmbiguous(err):
			return s.resolveClaim(ctx, p, res, err)
		default:
			return res, translate("claim", err)
		}
		var (
			gen             pgtype.Int8
			takeover, exist bool
			raw             rawRecord
		)
		dest := append([]any{&gen, &takeover, &exist}, raw.targets()...)
		if err := s.queryRow(ctx, q, s.q.claim, args, dest...); err != nil {
			if s.onPool(q) && isAmbiguous(err) {
				return s.resolveClaim(ctx, p, res, err)
			}
			return res, translate("claim", err)
		}
		if gen.Valid {
			res.Acquired = true
			res.Token = fence.Token{Generation: uint64(gen.Int64), Owner: p.Owner}
			res.Takeover = takeover
			res.Restarted = !takeover && exist
			return res, nil
		}
		if !raw.valid() {
			// The conflicting row was committed after this statement's
			// snapshot: read it with a new one.
			err := q.QueryRow(ctx, s.q.get, keyArgs(ref)...).Scan(raw.targets()...)
			if errors.Is(err, pgx.ErrNoRows) {
				continue // deleted since (swept): claim again
			}
			if err != nil {
				return res, translate("claim", err)
			}
		}
		rec, err := raw.record()
		if err != nil {
			return res, err
		}
		return classify(res, rec, p.Fingerprint)
	}
	return res, errConflictLoop
}

// claimNew runs claimNewSQL when p.ExpectNew, and otherwise answers
// pgx.ErrNoRows without a statement.
func (s *store) claimNew(ctx context.Context, q querier, p storeapi.ClaimParams, args []any, gen *int64) error {
	if !p.ExpectNew {
		return pgx.ErrNoRows
	}
	return s.queryRow(ctx, q, s.q.claimNew, args, gen)
}

// classify returns the existing record rec as the claim's answer.
// A record of another fingerprint is a mismatch.
func classify(res storeapi.ClaimResult, rec durable.Record, fingerprint string) (storeapi.ClaimResult, error) {
	res.Record = &rec
	if rec.Fingerprint != fingerprint {
		return res, errMismatch()
	}
	return res, nil
}

// resolveClaim learns the outcome of a claim whose connection was lost after
// it was sent.
func (s *store) resolveClaim(ctx context.Context, p storeapi.ClaimParams, res storeapi.ClaimResult, cause error) (storeapi.ClaimResult, error) {
	// Detached: a caller whose context was cancelled (the likely reason the
	// reply was lost) still learns whether it holds the key, instead of
	// leaving a claim of its owner to block the key for a lease.
	rctx, cancel := detached(ctx)
	defer cancel()
	rec, err := s.get(rctx, s.pool, res.Ref)
	if err != nil {
		return res, unavailable("claim (outcome unknown)", cause)
	}
	if rec.State == durable.Processing && rec.Token.Owner == p.Owner {
		res.Acquired, res.Token = true, rec.Token
		return res, nil
	}
	return classify(res, rec, p.Fingerprint)
}
