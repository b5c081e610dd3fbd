package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// The steps of a workflow (claim's Lease.Step, migration 008): inspect
// lists them, pending names the one an operation stopped at, resolve -step
// settles it. A step's result is the application's data (it may hold an
// account number or an email): it is shown only when -step-results asks,
// escaped and bounded.

// stepsSuffix names the steps table after the store's table: migration
// 008 creates <table>_steps.
const stepsSuffix = "_steps"

// stepResultShown bounds the bytes of a step result inspect -step-results
// shows.
const stepResultShown = 1024

// stepJSON is the printable form of a step: its result only when asked.
type stepJSON struct {
	Seq        int        `json:"seq"`
	Name       string     `json:"name"`
	State      string     `json:"state"`
	Key        string     `json:"key"`
	Repeatable bool       `json:"repeatable"`
	Generation uint64     `json:"generation"`
	Attempts   int        `json:"attempts"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// ResultBytes is the length of the recorded result.
	ResultBytes int `json:"result_bytes"`
	// With -step-results, a finished step's result: ResultText when it is
	// UTF-8, else ResultHex; at most stepResultShown bytes of it, and
	// ResultTruncated when there are more.
	ResultText      *string `json:"result_text,omitempty"`
	ResultHex       *string `json:"result_hex,omitempty"`
	ResultTruncated bool    `json:"result_truncated,omitempty"`
}

func toStepJSON(s durable.Step) stepJSON {
	j := stepJSON{
		Seq: s.Seq, Name: s.Name, State: string(s.State), Key: s.Key, Repeatable: s.Repeatable,
		Generation: s.Generation, Attempts: s.Attempts, StartedAt: s.StartedAt.UTC(), ResultBytes: s.Size,
	}
	if !s.FinishedAt.IsZero() {
		f := s.FinishedAt.UTC()
		j.FinishedAt = &f
	}
	if s.Result != nil {
		b, cut := boundResult(s.Result)
		if utf8.Valid(b) {
			t := string(b)
			j.ResultText = &t
		} else {
			h := hex.EncodeToString(b)
			j.ResultHex = &h
		}
		j.ResultTruncated = cut
	}
	return j
}

// boundResult returns at most stepResultShown bytes of b, cut at a rune
// boundary when b is UTF-8 text, and whether it cut.
func boundResult(b []byte) ([]byte, bool) {
	if len(b) <= stepResultShown {
		return b, false
	}
	if !utf8.Valid(b) {
		return b[:stepResultShown], true
	}
	n := stepResultShown
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return b[:n], true
}

// shownResult is the table form of a step result from toStepJSON: Go
// quoted text (control and non-printing characters escaped, so nothing
// reaches the terminal as it is), or "hex " and its bytes.
func shownResult(j stepJSON) string {
	var s string
	switch {
	case j.ResultText != nil:
		s = strconv.Quote(*j.ResultText)
	case j.ResultHex != nil:
		s = "hex " + *j.ResultHex
	default:
		return ""
	}
	if j.ResultTruncated {
		s += fmt.Sprintf(" ... (the first %d of %d bytes)", stepResultShown, j.ResultBytes)
	}
	return s
}

// hasStepsTable reports whether the store's steps table exists: a schema
// migrated before 008 has none, and then no operation has steps.
func (b *db) hasStepsTable(d dbFlags) (bool, error) {
	var exists bool
	if err := b.pool.QueryRow(b.ctx, `SELECT to_regclass($1) IS NOT NULL`, qualify(d.schema, d.table+stepsSuffix)).Scan(&exists); err != nil {
		return false, storeErr("look up the table", err)
	}
	return exists, nil
}

// pendingStep reports whether rec is an operation that can be at a step:
// uncertain, or processing and not released.
func pendingStep(rec durable.Record) bool {
	return rec.State == durable.Uncertain || rec.State == durable.Processing && !rec.Released
}

// stepLine describes the step a record stopped at (or runs), for inspect:
// "" when there is none.
func stepLine(rec durable.Record) (label, text string) {
	s := rec.Step
	if s == nil {
		return "", ""
	}
	label = "stopped at step"
	detail := string(s.State)
	switch {
	case rec.State == durable.Processing && rec.LeaseRemaining > 0:
		label = "running step"
	case rec.State == durable.Processing:
		detail += ", its worker's lease expired"
	}
	return label, fmt.Sprintf("%s (seq %d, %s; attempts %d; key %s)", s.Name, s.Seq, detail, s.Attempts, s.Key)
}

// stepCell is the STEP column of pending: the step's name, place and state.
func stepCell(s *durable.Step) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%s (seq %d, %s)", s.Name, s.Seq, s.State)
}

// printSteps writes inspect's table of steps; with results, each finished
// step's result below it, escaped and bounded.
func printSteps(w io.Writer, steps []stepJSON, haveTable, results bool) error {
	if !haveTable {
		_, err := fmt.Fprintln(w, "\nsteps: none (this schema has no steps table: migration 008 is not applied)")
		return err
	}
	if len(steps) == 0 {
		_, err := fmt.Fprintln(w, "\nsteps: none")
		return err
	}
	fmt.Fprintf(w, "\nsteps (%d):\n", len(steps))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  SEQ\tNAME\tSTATE\tREPEATABLE\tATTEMPTS\tGENERATION\tSTARTED AT\tFINISHED AT\tRESULT")
	const at = "2006-01-02T15:04:05.000Z07:00"
	for _, s := range steps {
		finished, size, rep := "-", "-", "no"
		if s.FinishedAt != nil {
			finished = s.FinishedAt.Format(at)
			size = fmt.Sprintf("%d bytes", s.ResultBytes)
		}
		if s.Repeatable {
			rep = "yes"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", s.Seq, s.Name, s.State, rep, s.Attempts, s.Generation, s.StartedAt.Format(at), finished, size)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !results {
		return nil
	}
	fmt.Fprintln(w, "\nstep results (-step-results):")
	for _, s := range steps {
		if r := shownResult(s); r != "" {
			fmt.Fprintf(w, "  %s: %s\n", s.Name, r)
		}
	}
	return nil
}

// stepFlags are resolve's flags that settle one step.
type stepFlags struct {
	name                    string
	happened, notHappened   bool
	resultText, resultFile  string
	result                  []byte
	resolutionState, effect string
}

func (s *stepFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.name, "step", "", "settle only this step of a workflow, the one the operation stopped at (inspect and pending name it), instead of the whole operation; with -happened or -not-happened")
	fs.BoolVar(&s.happened, "happened", false, "-step: its effect took place; give its result with -step-result or -step-result-file (the resume hands it to the workflow, the step does not run again)")
	fs.BoolVar(&s.notHappened, "not-happened", false, "-step: it never took effect; the resume runs it again with the same key")
	fs.StringVar(&s.resultText, "step-result", "", "-step -happened: the step's result, what its function would have returned ('' for an empty one)")
	fs.StringVar(&s.resultFile, "step-result-file", "", "-step -happened: read the step's result from this file, byte for byte (a trailing newline included)")
}

// wholeOperationFlags are resolve's flags that settle the whole operation.
var wholeOperationFlags = []string{"as", "format", "status", "body", "body-file", "content-type", "code", "message", "message-type", "descriptor-set", "result-version"}

// validate checks the step flags given (set): with -step, a valid name,
// exactly one of -happened and -not-happened, a result with -happened
// only, and none of the flags of a whole operation's result; without
// -step, none of its flags. It reads -step-result-file. Every error is a
// usage error, before anything is read or written.
func (s *stepFlags) validate(set map[string]bool) error {
	if !set["step"] {
		for _, f := range []string{"happened", "not-happened", "step-result", "step-result-file"} {
			if set[f] {
				return usagef("-%s goes with -step NAME, which settles one step of a workflow", f)
			}
		}
		return nil
	}
	for _, f := range wholeOperationFlags {
		if set[f] {
			return usagef("-step settles one step and takes -happened (with -step-result or -step-result-file) or -not-happened, not -%s (which settles the whole operation)", f)
		}
	}
	if !storeapi.ValidStepName(s.name) {
		return usagef("-step %q is not a step name: 1 to 64 letters, digits, '-', '_' or '.'", s.name)
	}
	switch {
	case s.happened && s.notHappened:
		return usagef("give -happened or -not-happened, not both")
	case !s.happened && !s.notHappened:
		return usagef("-step needs -happened (its effect took place: give its result with -step-result or -step-result-file) or -not-happened (it never took effect: the resume runs it again with the same key)")
	case s.notHappened && (set["step-result"] || set["step-result-file"]):
		return usagef("-not-happened takes no result: the resume runs the step again (-step-result and -step-result-file go with -happened)")
	case s.notHappened:
		s.resolutionState = "step-not-happened:" + s.name
		s.effect = "as not happened"
		return nil
	case set["step-result"] && set["step-result-file"]:
		return usagef("give -step-result or -step-result-file, not both")
	case set["step-result"]:
		s.result = []byte(s.resultText)
	case set["step-result-file"]:
		b, err := os.ReadFile(s.resultFile)
		if err != nil {
			return usagef("-step-result-file: %v", err)
		}
		s.result = b
	default:
		return usagef("-happened needs the step's result, what its function would have returned: -step-result TEXT (-step-result '' for an empty one) or -step-result-file F")
	}
	if len(s.result) > storeapi.MaxStepResult {
		return usagef("the step result is %d bytes: at most %d (1 MiB) are recorded", len(s.result), storeapi.MaxStepResult)
	}
	s.resolutionState = "step-happened:" + s.name
	s.effect = fmt.Sprintf("as happened (result %d bytes)", len(s.result))
	return nil
}

// notAtStep refuses, naming what the operation is at, unless cur is the
// step named name.
func notAtStep(rec durable.Record, steps []durable.Step, cur *durable.Step, name string) error {
	id := rec.Ref.OperationID()
	if cur == nil {
		return fmt.Errorf("resolve: operation %s is %s and stopped at no step (none is started and unfinished): nothing written; settle the whole operation with -as and -format instead", id, rec.State)
	}
	if cur.Name == name {
		return nil
	}
	named := "not among its steps"
	for _, s := range steps {
		if s.Name == name {
			named = fmt.Sprintf("seq %d, %s", s.Seq, s.State)
		}
	}
	return fmt.Errorf("resolve: operation %s is stopped at step %s (seq %d, %s), not %s (%s): nothing written", id, cur.Name, cur.Seq, cur.State, name, named)
}

// resolveStep settles step s.name of the operation o names, for resolve
// -step: it checks that the operation stopped at that step, adopts the
// record (fencing its worker) and has the store settle the step, which
// hands the record back to the workflow; the operator's reason goes into
// <table>_resolutions, committed only once the step is settled.
func resolveStep(e *env, d dbFlags, o opFlags, s stepFlags, stale time.Duration, reason, operator string) error {
	b, rec, err := o.open(e, &d, true, "resolve")
	if err != nil {
		return err
	}
	defer b.Close()
	id := rec.Ref.OperationID()
	ok, err := b.hasStepsTable(d)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("resolve: the table %s does not exist: it records the steps of workflows (migration 008, newer than this schema's), so no operation is at a step; run %s", qualify(d.schema, d.table+stepsSuffix), migrateHint(d))
	}
	if !pendingStep(rec) {
		state := string(rec.State)
		if rec.Released {
			state += " (released)"
		}
		return fmt.Errorf("resolve: operation %s is %s: it is not stopped at a step; nothing written", id, state)
	}
	if err := checkStale(b, rec, stale); err != nil {
		return err
	}
	steps, err := b.store.Steps(b.ctx, rec.Ref, false)
	if err != nil {
		return storeErr("resolve", err)
	}
	cur := storeapi.CurrentStep(steps)
	if err := notAtStep(rec, steps, cur, s.name); err != nil {
		return err
	}
	seq := cur.Seq
	tok, err := b.store.Adopt(b.ctx, rec.Ref, uuid.New(), 0, adoptLease)
	switch {
	case errors.Is(err, durable.ErrBusy):
		return fmt.Errorf("resolve: operation %s is %s and not adoptable (a live lease: its worker is still at step %s, or it just finished): nothing written", id, rec.State, s.name)
	case err != nil:
		return storeErr("resolve", err)
	}
	// Under the adopted token nothing else writes a step: read again, so
	// the step settled is the one the operation is at now.
	if steps, err = b.store.Steps(b.ctx, rec.Ref, false); err != nil {
		return storeErr("resolve", err)
	}
	if now := storeapi.CurrentStep(steps); now == nil || now.Name != s.name || now.Seq != seq {
		return fmt.Errorf("resolve: operation %s moved off step %s before it was adopted (now at %s): adopted at generation %d, nothing settled; inspect it and run resolve again", id, s.name, stepCell(now), tok.Generation)
	}
	// The reason is written first in a transaction of its own, committed
	// once SettleStep (a transaction of the store's) succeeded: a refused
	// settle records nothing.
	settling, settled := false, false
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := recordResolution(ctx, tx, d, rec.Ref, tok.Generation, durable.State(s.resolutionState), 0, reason, operator); err != nil {
			return err
		}
		settling = true
		if err := b.store.SettleStep(ctx, rec.Ref, tok, seq, s.happened, s.result); err != nil {
			return err
		}
		settled = true
		return nil
	})
	switch {
	case err != nil && settled:
		return fmt.Errorf("resolve: step %s of operation %s is settled %s at generation %d, but its reason could not be recorded in %s: %v", s.name, id, s.effect, tok.Generation, qualify(d.schema, d.table+resolutionsSuffix), err)
	case errors.Is(err, durable.ErrFenced):
		return fmt.Errorf("resolve: operation %s moved on after it was adopted (another resolver or the reconciler): nothing written", id)
	case errors.Is(err, durable.ErrNotFound):
		return fmt.Errorf("resolve: step %s of operation %s is no longer unfinished (settled by someone else?): nothing written", s.name, id)
	case errors.Is(err, durable.ErrUnavailable) && settling:
		return fmt.Errorf("resolve: database unavailable while settling step %s of operation %s: the outcome is unknown and the reason is not recorded; see oncekey inspect: %w", s.name, id, err)
	case err != nil:
		return storeErr("resolve", err)
	}
	fmt.Fprintf(e.stdout, "settled step %s (seq %d) of %s %s at generation %d; recorded in %s as %s\n",
		s.name, seq, id, s.effect, tok.Generation, qualify(d.schema, d.table+resolutionsSuffix), s.resolutionState)
	next := fmt.Sprintf("%s returns the recorded result without running, and the steps after it run", s.name)
	if s.notHappened {
		next = fmt.Sprintf("%s runs again with its key %s (the steps before it return their recorded results)", s.name, storeapi.StepKey(rec.Ref, s.name))
	}
	fmt.Fprintf(e.stdout, "next: the operation is processing with its lease run out; the next retry of the same request takes it over and resumes: %s.\n", next)
	fmt.Fprintf(e.stdout, "nothing runs until that retry; without one, pending lists it again as stale processing after -stale.\n")
	return nil
}
