package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
)

func runPending(e *env, args []string) error {
	var d dbFlags
	fs := newFlags(e, "pending", "pending [flags]\n\n"+
		"Lists, oldest first, the operations the reconciler would look at: uncertain ones, and\n"+
		"processing ones whose lease expired at least -stale-after ago (their worker is presumed\n"+
		"dead). Tenants are shown as a digest; settle one with oncekey resolve.")
	d.register(fs, 30*time.Second)
	stale := fs.Duration("stale-after", 5*time.Minute, "list processing records whose lease expired at least this long ago (the reconciler's default)")
	limit := fs.Int("limit", 100, "at most this many (1 to 10000)")
	asJSON := fs.Bool("json", false, "print JSON lines")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if *stale < 0 {
		return usagef("-stale-after must not be negative")
	}
	if *limit < 1 || *limit > 10000 {
		return usagef("-limit must be 1 to 10000, got %d", *limit)
	}
	b, err := d.open(e, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	recs, err := b.store.Pending(b.ctx, *stale, *limit)
	if err != nil {
		return storeErr("pending", err)
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
	fmt.Fprintln(w, "OPERATION ID\tTENANT\tOPERATION\tSTATE\tGENERATION\tTAKEOVERS\tAGE")
	for _, r := range recs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", r.Ref.OperationID(), tenantDigest(r.Ref.Tenant), r.Ref.Operation,
			r.State, r.Token.Generation, r.Takeovers, time.Since(r.CreatedAt).Round(time.Second))
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
	fs := newFlags(e, "resolve", "resolve -tenant T (-operation OP -key K | -id op_...) -format http|grpc|message -as completed|failed RESULT -reason TEXT [flags]\n\n"+
		"Settles an uncertain operation (or a processing one whose lease expired) after the operator\n"+
		"found out what happened: it adopts the record under a new generation, so a late worker is\n"+
		"fenced out, then stores the result (replayed to every retry) and records the reason in\n"+
		"<table>_resolutions, in one transaction. A live lease or a finished record is refused.\n\n"+
		"-format is the format of the adapter that guards the operation, which replays the result;\n"+
		"a result it could not replay is refused before anything is written. RESULT by format:\n"+
		"  http     -status 200..599 [-body B | -body-file F] [-content-type T]\n"+
		"  grpc     -as failed:    -code NotFound|NOT_FOUND|5 [-message M]\n"+
		"           -as completed: -descriptor-set F -message-type pkg.Reply [-body JSON | -body-file F]\n"+
		"  message  [-status N] [-body B | -body-file F] [-content-type T] [-result-version V]")
	d.register(fs, 30*time.Second)
	o.register(fs)
	var r resultFlags
	r.register(fs)
	as := fs.String("as", "", "completed or failed (required)")
	reason := fs.String("reason", "", "why (required; recorded with the resolution)")
	operator := fs.String("operator", "", "who resolves (default $USER)")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if err := o.validate(e); err != nil {
		return err
	}
	state := durable.State(*as)
	if !state.Finished() {
		return usagef("-as must be completed or failed, got %q", *as)
	}
	res, shown, err := r.result(fs, state)
	if err != nil {
		return err
	}
	if *reason == "" {
		return usagef("-reason is required: it is recorded with the resolution")
	}
	if *operator == "" {
		*operator = e.getenv("USER")
	}
	secret, err := o.secret(e)
	if err != nil {
		return err
	}
	b, err := d.open(e, secret)
	if err != nil {
		return err
	}
	defer b.Close()
	rec, err := o.lookup(b.ctx, b.store)
	if errors.Is(err, errUsage) {
		return err
	}
	if err != nil {
		return storeErr("resolve", err)
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

// recordResolution writes the operator's reason into <table>_resolutions
// (created on first use), in the transaction that stores the result: both
// or neither. The record's identity is its operation id; the tenant and
// key hash stay in the records table only.
func recordResolution(ctx context.Context, tx pgx.Tx, d dbFlags, ref durable.Ref, gen uint64, state durable.State, status int, reason, operator string) error {
	t := d.table + "_resolutions"
	if d.schema != "" {
		t = d.schema + "." + t
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
		operation_id text        NOT NULL,
		operation    text        NOT NULL,
		generation   bigint      NOT NULL,
		state        text        NOT NULL,
		status_code  integer     NOT NULL,
		reason       text        NOT NULL,
		operator     text        NOT NULL,
		resolved_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
		PRIMARY KEY (operation_id, generation)
	)`); err != nil {
		return fmt.Errorf("resolutions table: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+t+` (operation_id, operation, generation, state, status_code, reason, operator)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		ref.OperationID(), ref.Operation, int64(gen), string(state), status, reason, operator); err != nil {
		return fmt.Errorf("record the reason: %w", err)
	}
	return nil
}
