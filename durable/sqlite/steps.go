package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// stepQueries are the statements of a workflow's steps (migration 004),
// on table {t}_steps. The record's life is its created_at; a step counts
// only in the life it was started in.
type stepQueries struct {
	holder, settleHolder, get, start, restart, uncertain       string
	finish, finished, list, settleFinish, settleDelete, resume string
}

func buildStepQueries(table string) stepQueries {
	r := strings.NewReplacer("{t}", table)
	return stepQueries{
		// The life of the record held by the token (?1-?3 pk, ?4 owner, ?5
		// generation), processing: what every step write is fenced by. In
		// a transaction that holds the write lock, so it stays so until
		// the transaction ends.
		holder: r.Replace(`SELECT created_at FROM {t} WHERE ` + fenced + ` AND state = 'processing'`),

		// holder for the reconciler's token, which holds an uncertain
		// record it adopted (its lease set: the token that marked it
		// uncertain cannot settle, as it cannot release) or a processing
		// one.
		settleHolder: r.Replace(`SELECT created_at FROM {t} WHERE ` + fenced + `
	AND (state = 'processing' OR (state = 'uncertain' AND lease_expires_at IS NOT NULL))`),

		// Step ?2 of digest ?1, of whatever life.
		get: r.Replace(`SELECT name, state, generation, result, life FROM {t}_steps WHERE operation_digest = ?1 AND seq = ?2`),

		// Step ?2 of digest ?1 started in life ?3 as ?4 (repeatable ?5)
		// under generation ?6, replacing a row of an earlier life.
		start: r.Replace(`INSERT INTO {t}_steps (operation_digest, seq, life, name, state, repeatable, generation, attempts, started_at)
VALUES (?1, ?2, ?3, ?4, 'started', ?5, ?6, 1, ` + now + `)
ON CONFLICT (operation_digest, seq) DO UPDATE SET life = excluded.life, name = excluded.name, state = 'started',
	repeatable = excluded.repeatable, generation = excluded.generation, attempts = 1,
	started_at = excluded.started_at, finished_at = NULL, result = NULL`),

		// Started step ?2 of digest ?1 in life ?4 started again under
		// generation ?3 (a repeatable step).
		restart: r.Replace(`UPDATE {t}_steps SET generation = ?3, attempts = attempts + 1, started_at = ` + now + `
WHERE operation_digest = ?1 AND seq = ?2 AND life = ?4 AND state = 'started'`),

		// Unfinished step ?2 of digest ?1 in life ?3 marked uncertain.
		uncertain: r.Replace(`UPDATE {t}_steps SET state = 'uncertain'
WHERE operation_digest = ?1 AND seq = ?2 AND life = ?3 AND state IN ('started', 'uncertain')`),

		// The result ?8 of step ?7 of digest ?6, started under the token's
		// generation (?5) in the record's life, while the token holds the
		// record (?1-?5), processing. One statement: the record and the
		// step are matched together (a missing or fenced record gives a
		// NULL life, which matches no step).
		finish: r.Replace(`UPDATE {t}_steps SET state = 'finished', result = ?8, finished_at = ` + now + `
WHERE operation_digest = ?6 AND seq = ?7 AND state = 'started' AND generation = ?5
	AND life = (SELECT created_at FROM {t} WHERE ` + fenced + ` AND state = 'processing')`),

		// Step ?5 of digest ?4 finished in the current life of the record
		// (?1-?3): its generation and result.
		finished: r.Replace(`SELECT st.generation, st.result FROM {t} r JOIN {t}_steps st
	ON st.operation_digest = ?4 AND st.seq = ?5 AND st.life = r.created_at
WHERE r.tenant_id = ?1 AND r.operation = ?2 AND r.key_hash = ?3 AND st.state = 'finished'`),

		// The steps of the current life of the record (?1-?3; ?4 its
		// digest) in order, the results only when ?5.
		list: r.Replace(`SELECT st.seq, st.name, st.state, st.repeatable, st.generation, st.attempts, st.started_at, st.finished_at,
	coalesce(length(st.result), 0), CASE WHEN ?5 THEN st.result END
FROM {t} r JOIN {t}_steps st ON st.operation_digest = ?4 AND st.life = r.created_at
WHERE r.tenant_id = ?1 AND r.operation = ?2 AND r.key_hash = ?3
ORDER BY st.seq`),

		// Step ?2 of digest ?1 in life ?3, left unfinished by an earlier
		// attempt, settled: finished with result ?4, or its row deleted
		// (it did not happen; a resume runs it).
		settleFinish: r.Replace(`UPDATE {t}_steps SET state = 'finished', result = ?4, finished_at = ` + now + `
WHERE operation_digest = ?1 AND seq = ?2 AND life = ?3 AND state IN ('started', 'uncertain')`),
		settleDelete: r.Replace(`DELETE FROM {t}_steps
WHERE operation_digest = ?1 AND seq = ?2 AND life = ?3 AND state IN ('started', 'uncertain')`),

		// The record held by the settling token (?1-?5) handed back to the
		// workflow: processing, its lease run out, so the next claim of
		// the same request takes it over and resumes (the life is kept).
		resume: r.Replace(`UPDATE {t} SET state = 'processing', lease_expires_at = ` + now + `
WHERE ` + fenced + ` AND state IN ('processing', 'uncertain')`),
	}
}

// fencedArgs are the arguments ?1-?5 of a statement matching the record
// held by tok (fenced), then more.
func fencedArgs(ref durable.Ref, tok fence.Token, more ...any) []any {
	return append([]any{ref.Tenant, ref.Operation, ref.KeyHash[:], tok.Owner.String(), int64(tok.Generation)}, more...)
}

// StartStep records step p.Seq of the operation held by tok as started,
// or returns what an earlier attempt recorded for it (see
// [storeapi.StepStore]), in one transaction that holds the write lock.
// An unfinished step of an earlier attempt that is not repeatable is
// marked uncertain, and the record with it (as MarkUncertain), and that
// commits: the answer is then Uncertain.
func (s *store) StartStep(ctx context.Context, ref durable.Ref, tok fence.Token, p storeapi.StepParams) (storeapi.StepStart, error) {
	if err := p.Validate(); err != nil {
		return storeapi.StepStart{}, fmt.Errorf("durable/sqlite: start step: %w", err)
	}
	if err := validWrite("start step", ref, tok); err != nil {
		return storeapi.StepStart{}, err
	}
	d := ref.Digest()
	var out storeapi.StepStart
	err := s.runTx(ctx, s.locking, func(ctx context.Context, tx *sql.Tx) error {
		out = storeapi.StepStart{}
		var life int64
		if err := s.queryRow(ctx, tx, s.q.steps.holder, fencedArgs(ref, tok)...).Scan(&life); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("durable/sqlite: start step: %w", durable.ErrFenced)
			}
			return translate("start step", err)
		}
		var (
			name, state  string
			gen, rowLife int64
			result       []byte
		)
		err := s.queryRow(ctx, tx, s.q.steps.get, d[:], p.Seq).Scan(&name, &state, &gen, &result, &rowLife)
		switch {
		case errors.Is(err, sql.ErrNoRows) || err == nil && rowLife != life:
			_, err := s.exec(ctx, tx, s.q.steps.start, d[:], p.Seq, life, p.Name, p.Repeatable, int64(tok.Generation))
			return translate("start step", err)
		case err != nil:
			return translate("start step", err)
		case name != p.Name:
			return fmt.Errorf("durable/sqlite: start step: %w: step %d is %q, not %q", durable.ErrStepOrder, p.Seq, name, p.Name)
		case state == string(durable.StepFinished):
			out.Finished, out.Result = true, nonNil(result)
			return nil
		case state == string(durable.StepStarted) && uint64(gen) == tok.Generation:
			return nil // started by this lease, whose answer was lost: its function has not run
		case state == string(durable.StepStarted) && p.Repeatable:
			out.Repeated = true
			return s.execOne(ctx, tx, "start step", s.q.steps.restart, d[:], p.Seq, int64(tok.Generation), life)
		}
		// Started by an earlier attempt, never finished, not repeatable (or
		// already uncertain): its effect may have happened. The operation
		// is uncertain here.
		out.Uncertain = true
		if err := s.execOne(ctx, tx, "start step", s.q.steps.uncertain, d[:], p.Seq, life); err != nil {
			return err
		}
		return s.execOne(ctx, tx, "start step", s.q.markUncertain, fencedArgs(ref, tok)...)
	})
	if err != nil {
		return storeapi.StepStart{}, err
	}
	return out, nil
}

// execOne runs a write on tx that must change exactly one row: inside the
// transaction that read what it writes, anything else is a bug, and the
// transaction rolls back.
func (s *store) execOne(ctx context.Context, tx *sql.Tx, op, query string, args ...any) error {
	n, err := s.rowsAffected(s.exec(ctx, tx, query, args...))
	if err != nil {
		return translate(op, err)
	}
	if n != 1 {
		return fmt.Errorf("durable/sqlite: %s: wrote %d rows where 1 was read; rolled back", op, n)
	}
	return nil
}

// FinishStep records result as the result of step seq, started under tok
// in the record's life, while tok holds the record (processing): one
// UPDATE under the write lock. Recording the same result again under tok
// succeeds; anything else that matches no row is [durable.ErrFenced].
func (s *store) FinishStep(ctx context.Context, ref durable.Ref, tok fence.Token, seq int, result []byte) error {
	if len(result) > storeapi.MaxStepResult {
		return fmt.Errorf("durable/sqlite: finish step: %w", storeapi.Invalid("step result", "longer than 1 MiB"))
	}
	if err := validWrite("finish step", ref, tok); err != nil {
		return err
	}
	result = nonNil(result)
	d := ref.Digest()
	unlock, err := s.lockWrites(ctx)
	if err != nil {
		return unavailable("finish step", err)
	}
	defer unlock()
	n, werr := s.rowsAffected(s.exec(ctx, s.db, s.q.steps.finish, fencedArgs(ref, tok, d[:], seq, result)...))
	if werr == nil && n == 1 {
		return nil
	}
	// Not applied now, or failed: already finished under this token's
	// generation with this result (a repeat, or a write that applied
	// although an error came back) is success. The re-read runs on a
	// context detached from ctx, which may be what failed the write.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	var (
		gen int64
		got []byte
	)
	err = s.queryRow(rctx, s.db, s.q.steps.finished, ref.Tenant, ref.Operation, ref.KeyHash[:], d[:], seq).Scan(&gen, &got)
	switch {
	case err == nil && uint64(gen) == tok.Generation && bytes.Equal(got, result):
		return nil
	case werr != nil:
		return translate("finish step", werr)
	case err != nil && !errors.Is(err, sql.ErrNoRows):
		return translate("finish step", err) // cannot tell: report that, not a guess
	}
	return fmt.Errorf("durable/sqlite: finish step: %w", durable.ErrFenced)
}

// Steps lists the steps of ref's current life, in order, with their
// results when results is set. A record without steps, or no record, has
// none (nil). It reads the last commit and does not wait for a writer.
func (s *store) Steps(ctx context.Context, ref durable.Ref, results bool) ([]durable.Step, error) {
	if err := validRef(ref); err != nil {
		return nil, err
	}
	d := ref.Digest()
	rows, err := s.query(ctx, s.db, s.q.steps.list, ref.Tenant, ref.Operation, ref.KeyHash[:], d[:], results)
	if err != nil {
		return nil, translate("steps", err)
	}
	defer rows.Close()
	var out []durable.Step
	for rows.Next() {
		var (
			st                 durable.Step
			state              string
			gen, started, size int64
			finished           sql.NullInt64
			result             []byte
		)
		if err := rows.Scan(&st.Seq, &st.Name, &state, &st.Repeatable, &gen, &st.Attempts, &started, &finished, &size, &result); err != nil {
			return nil, translate("steps", err)
		}
		st.State = durable.StepState(state)
		switch st.State {
		case durable.StepStarted, durable.StepFinished, durable.StepUncertain:
		default:
			return nil, fmt.Errorf("durable/sqlite: steps: malformed step %d (state %q)", st.Seq, state)
		}
		st.Generation, st.Size, st.Key = uint64(gen), int(size), storeapi.StepKey(ref, st.Name)
		st.StartedAt = time.UnixMicro(started).UTC()
		if finished.Valid {
			st.FinishedAt = time.UnixMicro(finished.Int64).UTC()
		}
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
// finished with result when happened, else as not run (its row deleted);
// then it hands the record back to the workflow, processing with its lease
// run out, so the next claim of the same request resumes. All in one
// transaction. ErrFenced when tok does not hold the record (processing or
// uncertain); ErrNotFound when the step is not unfinished in its current
// life.
func (s *store) SettleStep(ctx context.Context, ref durable.Ref, tok fence.Token, seq int, happened bool, result []byte) error {
	if len(result) > storeapi.MaxStepResult {
		return fmt.Errorf("durable/sqlite: settle step: %w", storeapi.Invalid("step result", "longer than 1 MiB"))
	}
	if err := validWrite("settle step", ref, tok); err != nil {
		return err
	}
	d := ref.Digest()
	return s.runTx(ctx, s.locking, func(ctx context.Context, tx *sql.Tx) error {
		var life int64
		if err := s.queryRow(ctx, tx, s.q.steps.settleHolder, fencedArgs(ref, tok)...).Scan(&life); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("durable/sqlite: settle step: %w", durable.ErrFenced)
			}
			return translate("settle step", err)
		}
		q, args := s.q.steps.settleDelete, []any{d[:], seq, life}
		if happened {
			q, args = s.q.steps.settleFinish, []any{d[:], seq, life, nonNil(result)}
		}
		n, err := s.rowsAffected(s.exec(ctx, tx, q, args...))
		if err != nil {
			return translate("settle step", err)
		}
		if n != 1 {
			return fmt.Errorf("durable/sqlite: settle step %d: %w", seq, durable.ErrNotFound)
		}
		return s.execOne(ctx, tx, "settle step", s.q.steps.resume, fencedArgs(ref, tok)...)
	})
}

// nonNil returns b, or an empty slice for nil: a recorded result is never
// nil (nor NULL: the driver binds an empty slice as an empty BLOB).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
