package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// defaultStale is the one staleness rule of pending and resolve: a
// processing operation whose lease expired at least this long ago is
// presumed abandoned by its worker (the reconciler's default).
const defaultStale = 5 * time.Minute

// staleFlag registers -stale; with alias, also -stale-after, its older
// name in pending.
func staleFlag(fs *flag.FlagSet, usage string, alias bool) *time.Duration {
	stale := fs.Duration("stale", defaultStale, usage)
	if alias {
		fs.DurationVar(stale, "stale-after", defaultStale, "the older name of -stale")
	}
	return stale
}

func runPending(e *env, args []string) error {
	var d dbFlags
	fs := newFlags(e, "pending", "pending [flags]\n\n"+
		"Lists, fewest takeovers first, then oldest, the operations the reconciler would look at: uncertain ones, and\n"+
		"processing ones whose lease expired at least -stale ago (their worker is presumed\n"+
		"dead). STEP is the step of its workflow it stopped at, if any (one more read per operation).\n"+
		"Tenants are shown as a digest; settle one with oncekey resolve (-step for that step), which\n"+
		"applies the same -stale.")
	d.register(fs, 30*time.Second)
	stale := staleFlag(fs, "list processing records whose lease expired at least this long ago (resolve's rule too)", true)
	limit := fs.Int("limit", 100, "at most this many (1 to 10000)")
	asJSON := fs.Bool("json", false, "print JSON lines")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if *stale < 0 {
		return usagef("-stale must not be negative")
	}
	if *limit < 1 || *limit > 10000 {
		return usagef("-limit must be 1 to 10000, got %d", *limit)
	}
	b, err := d.openTables(e, nil, false)
	if err != nil {
		return err
	}
	defer b.Close()
	recs, err := b.store.Pending(b.ctx, *stale, *limit)
	if err != nil {
		return storeErr("pending", err)
	}
	haveSteps, err := b.hasStepsTable(d)
	if err != nil {
		return err
	}
	for i := range recs {
		if !haveSteps || !pendingStep(recs[i]) {
			continue
		}
		steps, err := b.store.Steps(b.ctx, recs[i].Ref, false)
		if err != nil {
			return storeErr("pending", err)
		}
		recs[i].Step = storeapi.CurrentStep(steps)
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		for _, r := range recs {
			if err := enc.Encode(toJSON(r)); err != nil {
				return err
			}
		}
		return nil
	}
	if len(recs) == 0 {
		fmt.Fprintln(e.stdout, "no pending operations")
		return nil
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "OPERATION ID\tTENANT\tOPERATION\tSTATE\tGENERATION\tTAKEOVERS\tAGE\tSTEP")
	for _, r := range recs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.Ref.OperationID(), tenantDigest(r.Ref.Tenant), r.Ref.Operation,
			r.State, r.Token.Generation, r.Takeovers, time.Since(r.CreatedAt).Round(time.Second), stepCell(r.Step))
	}
	return w.Flush()
}

// adoptLease is how long resolve holds the operation between adopting it
// and storing the outcome; a resolve that dies in between leaves it to
// the next adopter after that.
const adoptLease = 30 * time.Second

func runResolve(e *env, args []string) error {
	var d dbFlags
	var o opFlags
	fs := newFlags(e, "resolve", "resolve -tenant T (-operation OP -key K | -id op_...) -format http|grpc|message -as completed|failed RESULT -reason TEXT [flags]\n"+
		"       resolve -tenant T (-operation OP -key K | -id op_...) -step NAME (-happened (-step-result R | -step-result-file F) | -not-happened) -reason TEXT [flags]\n\n"+
		"Settles an uncertain operation (or a processing one whose lease expired at least -stale ago,\n"+
		"as pending lists them) after the operator found out what happened: it adopts the record under\n"+
		"a new generation, so a late worker is fenced out, then stores the result (replayed to every\n"+
		"retry) and records the reason and the operator in <table>_resolutions (migration 005), in one\n"+
		"transaction. A live lease, a lease expired less than -stale ago (pass -stale 0 to settle it\n"+
		"anyway) or a finished record is refused. -format http: -as completed takes a status below 400,\n"+
		"-as failed one of 400 or more (what claimhttp stores as completed and failed).\n\n"+
		"-format is the format of the adapter that guards the operation, which replays the result;\n"+
		"a result it could not replay is refused before anything is written. RESULT by format:\n"+
		"  http     -status 200..599 [-body B | -body-file F] [-content-type T]\n"+
		"  grpc     -as failed:    -code NotFound|NOT_FOUND|5 [-message M]\n"+
		"           -as completed: -descriptor-set F -message-type pkg.Reply [-body JSON | -body-file F]\n"+
		"  message  [-status N] [-body B | -body-file F] [-content-type T] [-result-version V]\n\n"+
		"-step NAME settles only the step of a workflow the operation stopped at (inspect and pending\n"+
		"name it; any other step is refused): -happened records it finished with the given result,\n"+
		"-not-happened as never run. It adopts the record as above, then the store records the step and\n"+
		"hands the operation back to the workflow (processing, its lease run out): the next retry of the\n"+
		"same request resumes from that step. The reason is recorded with the state step-happened:NAME\n"+
		"or step-not-happened:NAME (status 0), committed once the step is settled.")
	d.register(fs, 30*time.Second)
	o.register(fs)
	var r resultFlags
	r.register(fs)
	var sf stepFlags
	sf.register(fs)
	as := fs.String("as", "", "completed or failed (required)")
	reason := fs.String("reason", "", "why (required; recorded with the resolution)")
	operator := fs.String("operator", "", "who resolves, recorded with the resolution (default $USER; required when $USER is empty)")
	stale := staleFlag(fs, "settle a processing operation only when its lease expired at least this long ago, as pending lists it; 0: as soon as it expired (uncertain ones any time)", false)
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if *stale < 0 {
		return usagef("-stale must not be negative")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := sf.validate(set); err != nil {
		return err
	}
	if err := o.validate(e); err != nil {
		return err
	}
	if set["step"] {
		if err := who(e, *reason, operator); err != nil {
			return err
		}
		return resolveStep(e, d, o, sf, *stale, *reason, *operator)
	}
	state := durable.State(*as)
	if !state.Finished() {
		return usagef("-as must be completed or failed, got %q", *as)
	}
	res, shown, err := r.result(fs, state)
	if err != nil {
		return err
	}
	if err := who(e, *reason, operator); err != nil {
		return err
	}
	b, rec, err := o.open(e, &d, true, "resolve")
	if err != nil {
		return err
	}
	defer b.Close()
	if err := checkStale(b, rec, *stale); err != nil {
		return err
	}
	// Adopt: a new generation under a fresh owner; the original worker's
	// token no longer matches and its late Complete is fenced.
	tok, err := b.store.Adopt(b.ctx, rec.Ref, uuid.New(), 0, adoptLease)
	switch {
	case errors.Is(err, durable.ErrBusy):
		return fmt.Errorf("resolve: operation %s is %s and not adoptable (a live lease, or already finished): nothing written", rec.Ref.OperationID(), rec.State)
	case err != nil:
		return storeErr("resolve", err)
	}
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := recordResolution(ctx, tx, d, rec.Ref, tok.Generation, state, res.StatusCode, *reason, *operator); err != nil {
			return err
		}
		if state == durable.Completed {
			return b.store.Complete(ctx, tx, rec.Ref, tok, res)
		}
		return b.store.Fail(ctx, tx, rec.Ref, tok, res)
	})
	switch {
	case errors.Is(err, durable.ErrFenced):
		return fmt.Errorf("resolve: operation %s moved on after it was adopted (another resolver or the reconciler): nothing written", rec.Ref.OperationID())
	case err != nil:
		return storeErr("resolve", err)
	}
	fmt.Fprintf(e.stdout, "resolved %s as %s (%s) at generation %d\n", rec.Ref.OperationID(), state, shown, tok.Generation)
	return nil
}

// who checks the reason and the operator of a resolution, the operator
// defaulting to $USER.
func who(e *env, reason string, operator *string) error {
	if reason == "" {
		return usagef("-reason is required: it is recorded with the resolution")
	}
	if *operator == "" {
		*operator = e.getenv("USER")
	}
	if strings.TrimSpace(*operator) == "" {
		return usagef("-operator is required when $USER is empty: who resolves is recorded with the resolution")
	}
	return nil
}

// resolutionsSuffix names the table of the operators' reasons after the
// store's table: migration 005 creates <table>_resolutions.
const resolutionsSuffix = "_resolutions"

// checkStale refuses to settle a processing operation whose lease expired
// less than stale ago: the rule pending lists by, read as the store reads
// it (Pending, by the database's clock). A live lease and a finished
// record are left to Adopt, which refuses both.
func checkStale(b *db, rec durable.Record, stale time.Duration) error {
	if rec.State != durable.Processing || rec.Released || rec.LeaseRemaining > 0 || stale == 0 {
		return nil
	}
	recs, err := b.store.Pending(b.ctx, stale, pendingScan)
	if err != nil {
		return storeErr("resolve", err)
	}
	for _, r := range recs {
		if r.Ref.Tenant == rec.Ref.Tenant && r.Ref.Digest() == rec.Ref.Digest() {
			return nil
		}
	}
	return fmt.Errorf("resolve: operation %s is processing and its lease expired less than -stale %s ago (pending does not list it yet): its worker may still finish it; wait, or pass -stale 0 to settle it now: nothing written", rec.Ref.OperationID(), stale)
}

// recordResolution writes the operator's reason into <table>_resolutions
// (migration 005; requireTables checked it exists), in the transaction
// that stores the result: both or neither. The record's identity is its
// operation id; the tenant and key hash stay in the records table only.
func recordResolution(ctx context.Context, tx pgx.Tx, d dbFlags, ref durable.Ref, gen uint64, state durable.State, status int, reason, operator string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+qualify(d.schema, d.table+resolutionsSuffix)+` (operation_id, operation, generation, state, status_code, reason, operator)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		ref.OperationID(), ref.Operation, int64(gen), string(state), status, reason, operator); err != nil {
		return fmt.Errorf("record the reason: %w", err)
	}
	return nil
}
