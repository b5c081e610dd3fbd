package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// The statements of a workflow's steps (migration 008). %T is the records'
// table, %ST its steps table; $1-$6 as fenceWhere (keyArgs, then the
// generation and owner) where a statement is fenced.
const (
	// stepHolderSQL locks the record held by the token, processing, and
	// returns its life (created_at): what every step write is fenced by.
	stepHolderSQL = `SELECT created_at FROM %T ` + fenceWhere + ` AND state = 'processing' FOR UPDATE`

	// stepSettleHolderSQL is stepHolderSQL for the reconciler's token,
	// which holds an uncertain record it adopted (its lease set: the token
	// that marked it uncertain cannot settle, as it cannot release) or a
	// processing one.
	stepSettleHolderSQL = `SELECT created_at FROM %T ` + fenceWhere + `
	AND (state = 'processing' OR (state = 'uncertain' AND lease_expires_at IS NOT NULL)) FOR UPDATE`

	// stepGetSQL reads step $2 of digest $1 and locks it: a FinishStep of
	// an earlier owner in flight on it commits (or not) before the caller
	// decides.
	stepGetSQL = `SELECT name, state, generation, result, life FROM %ST WHERE operation_digest = $1::bytea AND seq = $2::integer FOR UPDATE`

	// stepStartSQL records step $2 of digest $1 as started under
	// generation $6, in life $3, replacing a row of an earlier life.
	stepStartSQL = `INSERT INTO %ST (operation_digest, seq, life, name, state, repeatable, generation, attempts, started_at)
VALUES ($1::bytea, $2::integer, $3::timestamptz, $4::text, 'started', $5::boolean, $6::bigint, 1, clock_timestamp())
ON CONFLICT (operation_digest, seq) DO UPDATE SET life = EXCLUDED.life, name = EXCLUDED.name, state = 'started',
	repeatable = EXCLUDED.repeatable, generation = EXCLUDED.generation, attempts = 1,
	started_at = EXCLUDED.started_at, finished_at = NULL, result = NULL`

	// stepRestartSQL starts a repeatable step again under generation $3.
	stepRestartSQL = `UPDATE %ST SET generation = $3::bigint, attempts = attempts + 1, started_at = clock_timestamp()
WHERE operation_digest = $1::bytea AND seq = $2::integer AND state = 'started'`

	// stepUncertainSQL marks step $2 of digest $1 uncertain.
	stepUncertainSQL = `UPDATE %ST SET state = 'uncertain' WHERE operation_digest = $1::bytea AND seq = $2::integer AND state <> 'finished'`

	// stepFinishSQL records the result $8 of step $7, started under the
	// token's generation in the record's life, while the token holds the
	// record (processing). One statement; the record's row is locked FOR
	// SHARE, so a takeover (which updates it) waits for this write, or this
	// write, waiting for a takeover, finds the record no longer the token's
	// and writes nothing: the fence of Complete.
	stepFinishSQL = `WITH h AS MATERIALIZED (
	SELECT created_at FROM %T ` + fenceWhere + ` AND state = 'processing' FOR SHARE
)
UPDATE %ST st SET state = 'finished', result = $8::bytea, finished_at = clock_timestamp()
FROM h
WHERE st.operation_digest = $4::bytea AND st.seq = $7::integer AND st.state = 'started'
	AND st.generation = $5::bigint AND st.life = h.created_at`

	// stepsSQL lists the steps of the record's current life, in order;
	// the results only when $5.
	stepsSQL = `SELECT st.seq, st.name, st.state, st.repeatable, st.generation, st.attempts, st.started_at, st.finished_at,
	COALESCE(octet_length(st.result), 0), CASE WHEN $5::boolean THEN st.result END
FROM %ST st JOIN %T r ON r.operation_digest = st.operation_digest AND st.life = r.created_at
WHERE r.operation_digest = $4::bytea AND r.tenant_id = $1::text AND r.operation = $2::text AND r.key_hash = $3::bytea
ORDER BY st.seq`

	// stepSettleSQL settles step $2 of digest $1 in life $3 that an
	// earlier attempt left unfinished: finished with result $4 when $5,
	// else its row is deleted (it did not happen; a resume runs it).
	stepSettleFinishSQL = `UPDATE %ST SET state = 'finished', result = $4::bytea, finished_at = clock_timestamp()
WHERE operation_digest = $1::bytea AND seq = $2::integer AND life = $3::timestamptz AND state IN ('started', 'uncertain')`
	stepSettleDeleteSQL = `DELETE FROM %ST
WHERE operation_digest = $1::bytea AND seq = $2::integer AND life = $3::timestamptz AND state IN ('started', 'uncertain')`

	// stepResumeSQL hands the record, held by the settling token, back to
	// the workflow: processing, with its lease run out, so the next claim
	// of the same request takes it over and resumes (the life is kept).
	stepResumeSQL = `UPDATE %T SET state = 'processing', lease_expires_at = clock_timestamp() ` + fenceWhere

	// stepMarkUncertainSQL moves the record held by the token to
	// uncertain, as markUncertainSQL, inside the step's transaction.
	stepMarkUncertainSQL = markUncertainSQL
)

type stepQueries struct {
	holder, settleHolder, get, start, restart, uncertain, finish, list, settleFinish, settleDelete, resume, markUncertain string
}

func buildStepQueries(f func(string) string) stepQueries {
	return stepQueries{
		holder: f(stepHolderSQL), settleHolder: f(stepSettleHolderSQL), get: f(stepGetSQL), start: f(stepStartSQL),
		restart: f(stepRestartSQL), uncertain: f(stepUncertainSQL), finish: f(stepFinishSQL), list: f(stepsSQL),
		settleFinish: f(stepSettleFinishSQL), settleDelete: f(stepSettleDeleteSQL), resume: f(stepResumeSQL),
		markUncertain: f(stepMarkUncertainSQL),
	}
}

// StartStep records step p.Seq of the operation held by tok as started,
// or returns what an earlier attempt recorded for it, in one transaction
// that locks the record (see [storeapi.StepStore]).
func (s *store) StartStep(ctx context.Context, ref durable.Ref, tok fence.Token, p storeapi.StepParams) (storeapi.StepStart, error) {
	if err := p.Validate(); err != nil {
		return storeapi.StepStart{}, fmt.Errorf("durable/postgres: start step: %w", err)
	}
	d := ref.Digest()
	var out storeapi.StepStart
	err := s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var life pgtype.Timestamptz
		if err := tx.QueryRow(ctx, s.q.steps.holder, fenceArgs(ref, tok)...).Scan(&life); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fencedErr("start step")
			}
			return translate("start step", err)
		}
		var name, state string
		var gen int64
		var result []byte
		var rowLife pgtype.Timestamptz
		err := tx.QueryRow(ctx, s.q.steps.get, d[:], p.Seq).Scan(&name, &state, &gen, &result, &rowLife)
		switch {
		case errors.Is(err, pgx.ErrNoRows) || err == nil && !rowLife.Time.Equal(life.Time):
			_, err := tx.Exec(ctx, s.q.steps.start, d[:], p.Seq, life, p.Name, p.Repeatable, int64(tok.Generation))
			return translate("start step", err)
		case err != nil:
			return translate("start step", err)
		case name != p.Name:
			return fmt.Errorf("durable/postgres: start step: %w: step %d is %q, not %q", durable.ErrStepOrder, p.Seq, name, p.Name)
		case state == string(durable.StepFinished):
			out.Finished, out.Result = true, nonNil(result)
			return nil
		case state == string(durable.StepStarted) && uint64(gen) == tok.Generation:
			return nil // started by this lease, whose reply was lost: its function has not run
		case state == string(durable.StepStarted) && p.Repeatable:
			out.Repeated = true
			_, err := tx.Exec(ctx, s.q.steps.restart, d[:], p.Seq, int64(tok.Generation))
			return translate("start step", err)
		}
		// Started by an earlier attempt, never finished, not repeatable:
		// its effect may have happened. The operation is uncertain here.
		out.Uncertain = true
		if _, err := tx.Exec(ctx, s.q.steps.uncertain, d[:], p.Seq); err != nil {
			return translate("start step", err)
		}
		_, err = tx.Exec(ctx, s.q.steps.markUncertain, fenceArgs(ref, tok)...)
		return translate("start step", err)
	})
	if err != nil {
		return storeapi.StepStart{}, err
	}
	return out, nil
}

// FinishStep records result as the result of step seq, started under tok
// in the record's life, while tok holds the record. Recording the same
// result again under tok succeeds; a reply lost in between is ErrUnavailable.
func (s *store) FinishStep(ctx context.Context, ref durable.Ref, tok fence.Token, seq int, result []byte) error {
	if len(result) > storeapi.MaxStepResult {
		return fmt.Errorf("durable/postgres: finish step: %w", storeapi.Invalid("step result", "longer than 1 MiB"))
	}
	n, err := s.exec(ctx, s.pool, s.q.steps.finish, fenceArgs(ref, tok, seq, nonNil(result)))
	if err != nil {
		return translate("finish step", err)
	}
	if n == 1 {
		return nil
	}
	// Not applied now: already finished by this token with this result
	// (a repeat), or fenced.
	steps, err := s.Steps(ctx, ref, true)
	if err != nil {
		if errors.Is(err, durable.ErrNotFound) {
			return fencedErr("finish step")
		}
		return err
	}
	for _, st := range steps {
		if st.Seq == seq && st.State == durable.StepFinished && st.Generation == tok.Generation && bytes.Equal(st.Result, result) {
			return nil
		}
	}
	return fencedErr("finish step")
}

// Steps lists the steps of ref's current life, in order, with their
// results when results is set. A record without steps has none (nil).
func (s *store) Steps(ctx context.Context, ref durable.Ref, results bool) ([]durable.Step, error) {
	rows, err := s.pool.Query(ctx, s.q.steps.list, append(keyArgs(ref), results)...)
	if err != nil {
		return nil, translate("steps", err)
	}
	defer rows.Close()
	var out []durable.Step
	for rows.Next() {
		var st durable.Step
		var state string
		var gen int64
		var finished pgtype.Timestamptz
		var result []byte
		if err := rows.Scan(&st.Seq, &st.Name, &state, &st.Repeatable, &gen, &st.Attempts, &st.StartedAt, &finished, &st.Size, &result); err != nil {
			return nil, translate("steps", err)
		}
		st.State, st.Generation, st.FinishedAt, st.Key = durable.StepState(state), uint64(gen), finished.Time, storeapi.StepKey(ref, st.Name)
		if results && st.State == durable.StepFinished {
			st.Result = nonNil(result)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, translate("steps", err)
	}
	return out, nil
}

// SettleStep settles step seq, which an earlier attempt left unfinished,
// for the token that holds the record (the reconciler's, adopted): as
// finished with result when happened, else as not run; then it hands the
// record back to the workflow, processing with its lease run out, so the
// next claim of the same request resumes. ErrFenced when tok does not
// hold the record; ErrNotFound when the step is not unfinished in its
// current life.
func (s *store) SettleStep(ctx context.Context, ref durable.Ref, tok fence.Token, seq int, happened bool, result []byte) error {
	if len(result) > storeapi.MaxStepResult {
		return fmt.Errorf("durable/postgres: settle step: %w", storeapi.Invalid("step result", "longer than 1 MiB"))
	}
	d := ref.Digest()
	return s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var life pgtype.Timestamptz
		if err := tx.QueryRow(ctx, s.q.steps.settleHolder, fenceArgs(ref, tok)...).Scan(&life); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fencedErr("settle step")
			}
			return translate("settle step", err)
		}
		q, args := s.q.steps.settleDelete, []any{d[:], seq, life}
		if happened {
			q, args = s.q.steps.settleFinish, []any{d[:], seq, life, nonNil(result)}
		}
		tag, err := tx.Exec(ctx, q, args...)
		if err != nil {
			return translate("settle step", err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("durable/postgres: settle step %d: %w", seq, durable.ErrNotFound)
		}
		_, err = tx.Exec(ctx, s.q.steps.resume, fenceArgs(ref, tok)...)
		return translate("settle step", err)
	})
}

// nonNil returns b, or an empty slice for nil: a recorded result is never
// nil.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
