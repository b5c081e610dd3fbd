package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// Get reads a record; ErrNotFound when there is none. LeaseRemaining and
// ExpiresIn are measured by the database's clock. It reads the last commit
// and does not wait for a writer.
func (s *store) Get(ctx context.Context, ref durable.Ref) (durable.Record, error) {
	if err := validRef(ref); err != nil {
		return durable.Record{}, err
	}
	rec, err := s.get(ctx, s.db, ref)
	return rec, translate("get", err)
}

// get returns database/sql's errors untranslated (sql.ErrNoRows included).
func (s *store) get(ctx context.Context, q querier, ref durable.Ref) (durable.Record, error) {
	return scanRecord(s.queryRow(ctx, q, s.q.get, ref.Tenant, ref.Operation, ref.KeyHash[:]))
}

// Operation reads the record whose operation identity has digest, within
// tenant: one read by the operation index. Another tenant's record, like an
// unknown digest, returns an error matching [durable.ErrNotFound].
func (s *store) Operation(ctx context.Context, tenant string, digest [32]byte) (durable.Record, error) {
	rec, err := scanRecord(s.queryRow(ctx, s.db, s.q.operation, digest[:], tenant))
	return rec, translate("operation", err)
}

// Adopt takes over, for the reconciler, a record that is uncertain (its
// lease free or expired) or processing with an expired lease, both by the
// database's clock. The state is kept; the generation becomes
// max(proposed, stored+1) (no clock floor: the row exists) and the owner and
// lease are the caller's.
// It returns ErrNotFound when there is no record and ErrBusy when the record
// is held by a live lease, released or finished.
func (s *store) Adopt(ctx context.Context, ref durable.Ref, owner uuid.UUID, proposed uint64, lease time.Duration) (fence.Token, error) {
	if err := validRef(ref); err != nil {
		return fence.Token{}, err
	}
	if owner == uuid.Nil {
		return fence.Token{}, storeapi.Invalid("owner", "nil UUID")
	}
	if err := validLease(lease); err != nil {
		return fence.Token{}, err
	}
	if proposed > 1<<62 {
		return fence.Token{}, storeapi.Invalid("proposed", "generation out of range")
	}
	unlock, err := s.lockWrites(ctx)
	if err != nil {
		return fence.Token{}, unavailable("adopt", err)
	}
	defer unlock()
	var gen int64
	err = s.queryRow(ctx, s.db, s.q.adopt, ref.Tenant, ref.Operation, ref.KeyHash[:],
		owner.String(), int64(proposed), lease.Microseconds()).Scan(&gen)
	if err == nil {
		return fence.Token{Generation: uint64(gen), Owner: owner}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fence.Token{}, translate("adopt", err)
	}
	var n int
	if err := s.queryRow(ctx, s.db, s.q.adoptable, ref.Tenant, ref.Operation, ref.KeyHash[:]).Scan(&n); err != nil {
		return fence.Token{}, translate("adopt", err)
	}
	if n == 0 {
		return fence.Token{}, fmt.Errorf("durable/sqlite: adopt: %w", durable.ErrNotFound)
	}
	return fence.Token{}, fmt.Errorf("durable/sqlite: adopt: %w", durable.ErrBusy)
}

// Pending lists, oldest first, at most limit records the reconciler should
// look at: uncertain records whose lease is free, and processing records
// whose lease expired at least staleFor ago by the database's clock.
// Released records are not listed.
func (s *store) Pending(ctx context.Context, staleFor time.Duration, limit int) ([]durable.Record, error) {
	if limit < 1 {
		return nil, storeapi.Invalid("limit", "less than 1")
	}
	if staleFor < 0 {
		return nil, storeapi.Invalid("stale for", "negative")
	}
	rows, err := s.query(ctx, s.db, s.q.pending, staleFor.Microseconds(), limit)
	if err != nil {
		return nil, translate("pending", err)
	}
	defer rows.Close()
	var out []durable.Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, translate("pending", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, translate("pending", err)
	}
	return out, nil
}

// Sweep deletes at most batch finished or released records past their
// retention, oldest expiry first, with their steps, and returns how many
// records it deleted. A record whose generation is not below the
// database's clock in milliseconds minus 120000 (one created or restarted
// in about the last minute) stays until the clock passes it, so that
// generations rise across the sweep. Processing and uncertain records are
// never deleted. One call is one transaction: a bounded DELETE of records,
// then one of the steps of each, so it holds the write lock only briefly;
// call it in a loop until it returns less than batch. batch must be at
// least 1.
func (s *store) Sweep(ctx context.Context, batch int) (int, error) {
	if batch < 1 {
		return 0, storeapi.Invalid("batch", "less than 1")
	}
	var n int
	err := s.runTx(ctx, s.locking, func(ctx context.Context, tx *sql.Tx) error {
		n = 0
		rows, err := s.query(ctx, tx, s.q.sweep, batch)
		if err != nil {
			return translate("sweep", err)
		}
		// Every record is deleted by the first step of the statement; the
		// rows are read to the end before the steps go.
		var digests [][]byte
		for rows.Next() {
			var d []byte
			if err := rows.Scan(&d); err != nil {
				rows.Close()
				return translate("sweep", err)
			}
			n++
			if d != nil { // a row from before 003 has no digest, and no steps
				digests = append(digests, d)
			}
		}
		if err := rows.Close(); err != nil {
			return translate("sweep", err)
		}
		if err := rows.Err(); err != nil {
			return translate("sweep", err)
		}
		for _, d := range digests {
			if _, err := s.exec(ctx, tx, s.q.sweepSteps, d); err != nil {
				return translate("sweep", err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Stats summarizes the store in one read of the whole table (SQLite keeps
// no counters), by the database's clock.
func (s *store) Stats(ctx context.Context) (durable.Stats, error) {
	var (
		st                                    durable.Stats
		processing, completed, failed, uncrtn int64
		oldest                                int64
	)
	err := s.queryRow(ctx, s.db, s.q.stats).Scan(&processing, &completed, &failed, &uncrtn,
		&st.Released, &oldest, &st.StaleProcessing, &st.ExpiredUnswept, &st.ExpiredStuck, &st.Takeovers)
	if err != nil {
		return durable.Stats{}, translate("stats", err)
	}
	st.ByState = map[durable.State]int64{
		durable.Processing: processing,
		durable.Completed:  completed,
		durable.Failed:     failed,
		durable.Uncertain:  uncrtn,
	}
	st.OldestUnexpiredAge = time.Duration(oldest) * time.Microsecond
	return st, nil
}
