package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// claimAttempts bounds how often a claim is tried again when the record
// changed between the claim statement and the read that classifies it (only
// another process writing the file, or a lease expiring in between, can do
// that).
const claimAttempts = 4

// Claim atomically inserts or takes over the record of p.Scope (see the
// durable package documentation for the rule), by the database's clock, in
// one statement. When the rule refuses, that statement writes nothing and a
// second one reads the existing record to return. It returns ErrMismatch for a record
// with another fingerprint, ErrInvalidScope for bad parameters (nothing
// written) and ErrUnavailable when the database cannot be used.
//
// With a non-nil tx the claim runs inside tx. Its statement takes the
// database's write lock if tx does not hold it yet, so a concurrent claimer
// of any scope waits (up to the busy timeout) until tx ends, and then sees
// what tx committed.
func (s *store) Claim(ctx context.Context, tx *sql.Tx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	ref, err := s.claimRef(p)
	if err != nil {
		return storeapi.ClaimResult{}, err
	}
	if tx != nil {
		return s.claim(ctx, tx, ref, p)
	}
	// Read first, without the write lock: a record the rule refuses (a
	// finished one within retention, a live lease, an uncertain one) is
	// answered by one read, so replays and in-progress answers never queue
	// behind writers. Only inside a caller's transaction is this skipped:
	// there a read snapshot followed by a write could fail with
	// SQLITE_BUSY_SNAPSHOT when another connection committed in between.
	if res, ok, err := s.readRefused(ctx, ref, p); ok || err != nil {
		return res, err
	}
	unlock, err := s.lockWrites(ctx)
	if err != nil {
		return storeapi.ClaimResult{}, unavailable("claim", err)
	}
	defer unlock()
	return s.claim(ctx, s.db, ref, p)
}

// readRefused reads the record of ref outside any lock. ok reports that it
// exists and the claim rule refuses it, with the answer the claim returns.
func (s *store) readRefused(ctx context.Context, ref durable.Ref, p storeapi.ClaimParams) (storeapi.ClaimResult, bool, error) {
	var claimable bool
	rec, err := scanRecord(s.queryRow(ctx, s.db, s.q.claimRead, ref.Tenant, ref.Operation, ref.KeyHash[:], p.Fingerprint), &claimable)
	switch {
	case errors.Is(err, sql.ErrNoRows), err == nil && claimable:
		return storeapi.ClaimResult{}, false, nil
	case err != nil:
		return storeapi.ClaimResult{}, false, translate("claim", err)
	case rec.Fingerprint != p.Fingerprint:
		return storeapi.ClaimResult{Ref: ref}, true, fmt.Errorf("durable/sqlite: claim: %w", durable.ErrMismatch)
	}
	return storeapi.ClaimResult{Ref: ref, Record: &rec}, true, nil
}

func (s *store) claimRef(p storeapi.ClaimParams) (durable.Ref, error) {
	if err := p.Validate(); err != nil {
		return durable.Ref{}, err
	}
	return p.Scope.Ref(s.cfg.secret), nil
}

func (s *store) claim(ctx context.Context, q querier, ref durable.Ref, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	digest := ref.Digest()
	for range claimAttempts {
		var (
			gen int64
			via string
		)
		err := s.queryRow(ctx, q, s.q.claim, ref.Tenant, ref.Operation, ref.KeyHash[:], p.Fingerprint,
			int64(p.Proposed), p.Owner.String(), p.Lease.Microseconds(), p.Retention.Microseconds(), digest[:]).Scan(&gen, &via)
		if err == nil {
			return storeapi.ClaimResult{
				Acquired:  true,
				Token:     fence.Token{Generation: uint64(gen), Owner: p.Owner},
				Ref:       ref,
				Takeover:  via == "takeover",
				Restarted: via == "restart",
			}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return storeapi.ClaimResult{}, translate("claim", err)
		}
		// The record exists and the rule refused it (nothing was written):
		// read it to classify. Between the two statements this Store writes
		// nothing (the caller holds its write lock or tx); another process
		// could, so a record that the rule would now accept, or that is
		// gone, is claimed again.
		var claimable bool
		rec, err := scanRecord(s.queryRow(ctx, q, s.q.claimRead, ref.Tenant, ref.Operation, ref.KeyHash[:], p.Fingerprint), &claimable)
		switch {
		case errors.Is(err, sql.ErrNoRows), err == nil && claimable:
			continue
		case err != nil:
			return storeapi.ClaimResult{}, translate("claim", err)
		case rec.Fingerprint != p.Fingerprint:
			return storeapi.ClaimResult{Ref: ref}, fmt.Errorf("durable/sqlite: claim: %w", durable.ErrMismatch)
		}
		return storeapi.ClaimResult{Ref: ref, Record: &rec}, nil
	}
	return storeapi.ClaimResult{}, fmt.Errorf("durable/sqlite: claim: %w: the record kept changing under the claim", durable.ErrUnavailable)
}
