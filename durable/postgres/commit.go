package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// InsertAtCommit runs fn in a new transaction begun as InTx begins it, then
// inserts the record of p.Scope finished with fn's state and result under
// tok, and commits, in one round trip (the INSERT and the COMMIT travel in
// one pipeline). Until then the transaction holds nothing of the record: it
// is the lease. A concurrent transaction inserting or claiming the same
// scope waits on the unique index (bounded by lock_timeout) for this one's
// outcome.
//
// With p.LockFirst, the BEGIN's round trip also takes the key's lock (the
// one every Claim takes) and checks that no record of the scope exists, in
// a statement after the lock: fn runs only when none does, and a
// concurrent request of the key waits for this COMMIT. A record that
// exists returns [storeapi.ErrExists], after a rollback, with fn not run.
//
// Outcomes: nil (committed with its record); [storeapi.ErrNotInserted] (a
// record of the scope exists, or tok.Generation is below the clock floor:
// rolled back); fn's error after a rollback; a refused COMMIT (rolled back,
// not ErrUnavailable); [durable.ErrUnavailable] when the pipeline's reply was
// lost after it was sent (the COMMIT may have applied: re-read with Get).
func (s *store) InsertAtCommit(ctx context.Context, p storeapi.ClaimParams, tok fence.Token, fn func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error)) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("durable/postgres: insert at commit: %w", err)
	}
	if tok.Generation < 1 || tok.Generation > 1<<62 || tok.Owner == [16]byte{} {
		return fmt.Errorf("durable/postgres: insert at commit: %w", storeapi.Invalid("token", "generation out of range or no owner"))
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return translate("begin", err)
	}
	// The transaction ends in the pipeline's COMMIT, not through tx, so the
	// connection goes back to the pool here, rolled back first unless it is
	// idle (committed) or closed.
	defer func() {
		if pc := conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, err := conn.Exec(rctx, "rollback")
			cancel()
			if err != nil {
				_ = pc.Close(rctx) // a lost connection rolls back on the server too
			}
		}
		conn.Release()
	}()
	ref := p.Scope.Ref(s.cfg.secret)
	digest := ref.Digest()
	begin := s.beginSQL
	if p.LockFirst {
		begin += s.lockFirstSQL(digest, tok.Generation)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		if p.LockFirst && notInserted(err) { // lockFirstSQL's 22012: a record exists, or tok is below the floor
			return storeapi.ErrExists
		}
		return translate("begin", err)
	}
	state, res, err := fn(ctx, tx)
	if err != nil {
		return err
	}
	sql := s.q.insertCompleted
	if p.LockFirst {
		sql = s.q.insertCompletedLocked
	}
	switch state {
	case durable.Completed:
	case durable.Failed:
		sql = s.q.insertFailed
		if p.LockFirst {
			sql = s.q.insertFailedLocked
		}
	default:
		return fmt.Errorf("durable/postgres: insert at commit: %w", storeapi.Invalid("state", "not finished"))
	}
	bin, jsonHeaders, body, err := encodeResult(res)
	if err != nil {
		return fmt.Errorf("durable/postgres: insert at commit: %w", err)
	}
	b := &pgx.Batch{}
	b.Queue(sql, ref.Tenant, ref.Operation, ref.KeyHash[:], p.Fingerprint, int64(tok.Generation), pgUUID(tok.Owner),
		res.StatusCode, jsonHeaders, bin, body, res.Version, res.ResourceID,
		p.Retention.Microseconds(), digest[:])
	b.Queue("commit")
	br := conn.SendBatch(ctx, b)
	_, ierr := br.Exec()
	var (
		tag  pgconn.CommandTag
		cerr error
	)
	if ierr == nil {
		tag, cerr = br.Exec()
	}
	_ = br.Close() // both replies were read, or the first failed: nothing more to learn
	var pgErr *pgconn.PgError
	switch {
	case ierr != nil && notInserted(ierr):
		return storeapi.ErrNotInserted
	case ierr != nil && errors.As(ierr, &pgErr):
		// The server refused the insert: the COMMIT after it was skipped.
		return fmt.Errorf("durable/postgres: insert at commit, rolled back: %w", translate("insert", ierr))
	case ierr != nil:
		return unavailable("insert at commit (outcome unknown: re-read)", ierr)
	case cerr != nil && commitRefused(cerr):
		return fmt.Errorf("durable/postgres: commit refused, transaction rolled back: %w", cerr)
	case cerr != nil:
		return unavailable("commit (outcome unknown: re-read)", cerr)
	case tag.String() != "COMMIT":
		return fmt.Errorf("durable/postgres: commit refused, transaction rolled back: %w", pgx.ErrTxCommitRollback)
	}
	return nil
}

// notInserted reports whether err is the insert's refusal: the row exists
// (unique_violation) or the generation is below the floor (division_by_zero
// by design, see insertFinishedSQL).
func notInserted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "22012")
}
