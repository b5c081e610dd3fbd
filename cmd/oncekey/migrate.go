package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/postgres"
)

func runMigrate(e *env, args []string) error {
	var d dbFlags
	fs := newFlags(e, "migrate", "migrate up|status|contract|down [flags]\n\n"+
		"  up      apply every migration and record its version (idempotent; what postgres.Migrate does at start-up);\n"+
		"          prints each version it applied, or \"up to date\" when there was none\n"+
		"  status  list the migrations of this build and whether each is recorded as applied\n"+
		"  contract apply the next contract step (with -yes): a change up never makes because an instance of an\n"+
		"          earlier version fails on it (007: the operation digest becomes the primary key); run it once every\n"+
		"          instance runs this version; it locks the table while it builds an index\n"+
		"  down    roll back the last applied migration (one step, with -yes); 001's down drops the table and every record\n\n"+
		"up, contract and down are serialized with every instance's Migrate by an advisory lock. Flags go before or after the action.")
	d.register(fs, 5*time.Minute)
	yes := fs.Bool("yes", false, "contract, down: confirm (required)")
	pos, err := parse(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one of up, status, contract, down")
	}
	action := pos[0]
	switch action {
	case "up", "status", "contract", "down":
	default:
		return usagef("unknown action %q: want up, status, contract or down", action)
	}
	if action == "contract" && !*yes {
		return usagef("contract makes a change instances of earlier versions fail on: add -yes once every instance runs this version")
	}
	if action == "down" && !*yes {
		return usagef("down rolls back a migration (001's drops every record): add -yes to confirm")
	}
	b, err := d.open(e, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	fsys := postgres.Migrations()
	switch action {
	case "up":
		return migrateUp(e, b, d)
	case "contract":
		m, err := pgmigrate.Contract(b.ctx, b.pool, fsys, d.target())
		if errors.Is(err, pgmigrate.ErrNoContract) {
			fmt.Fprintln(e.stdout, "no contract step left to apply")
			return nil
		}
		if err != nil {
			return fmt.Errorf("contract: %w", err)
		}
		fmt.Fprintf(e.stdout, "applied contract step %d (%s)\n", m.Version, m.Name)
		return nil
	case "down":
		m, err := pgmigrate.Down(b.ctx, b.pool, fsys, d.target())
		if errors.Is(err, pgmigrate.ErrNothingToRollBack) || errors.Is(err, pgmigrate.ErrUnrecorded) {
			return err
		}
		if err != nil {
			return fmt.Errorf("down: %w", err)
		}
		fmt.Fprintf(e.stdout, "rolled back version %d (%s)\n", m.Version, m.Name)
		return nil
	}
	st, err := pgmigrate.Status(b.ctx, b.pool, fsys, d.target())
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VERSION\tNAME\tAPPLIED")
	for _, m := range st.Migrations {
		at := "no"
		if m.Contract {
			at = "no (contract step: migrate contract -yes once every instance runs this version)"
		}
		if m.Applied {
			at = m.AppliedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\n", m.Version, m.Name, at)
	}
	w.Flush()
	for _, v := range st.Unknown {
		fmt.Fprintf(e.stdout, "version %d is recorded but unknown to this build (a newer build applied it)\n", v)
	}
	if st.Unrecorded {
		fmt.Fprintln(e.stdout, "the table exists but no versions are recorded (migrated by an earlier version): run migrate up to record them")
	}
	return nil
}

// migrateUp runs the migrations as postgres.Migrate does (the same files,
// machinery, lock and transaction; the command has no partitioned mode)
// and prints each version this run recorded: applied, or, for a database
// migrated before versions were recorded, found in place and recorded.
func migrateUp(e *env, b *db, d dbFlags) error {
	fsys := postgres.Migrations()
	before, err := pgmigrate.Status(b.ctx, b.pool, fsys, d.target())
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	recorded, err := pgmigrate.Up(b.ctx, b.pool, fsys, d.target())
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	ms, err := pgmigrate.List(fsys)
	if err != nil {
		return err
	}
	note := ""
	if before.Unrecorded {
		// The table was there, migrated before versions were recorded:
		// each up file ran again, a no-op for what was in place.
		note = " (applied, or found in place and recorded)"
	}
	for _, v := range recorded {
		for _, m := range ms {
			if m.Version == v {
				fmt.Fprintf(e.stdout, "applied version %d (%s)%s\n", m.Version, m.Name, note)
			}
		}
	}
	var last pgmigrate.Migration // the last one up applies
	for _, m := range ms {
		if !m.Contract {
			last = m
		}
	}
	if len(recorded) == 0 {
		fmt.Fprintf(e.stdout, "up to date: version %d (%s)\n", last.Version, last.Name)
		return nil
	}
	fmt.Fprintf(e.stdout, "now at version %d (%s)\n", last.Version, last.Name)
	return nil
}
