package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/internal/pgmigrate"
)

func runMigrate(e *env, args []string) error {
	var d dbFlags
	fs := newFlags(e, "migrate", "migrate [flags] up|status|down\n\n"+
		"  up      apply every migration and record its version (idempotent; what postgres.Migrate does at start-up)\n"+
		"  status  list the migrations of this build and whether each is recorded as applied\n"+
		"  down    roll back the last applied migration (one step); 001's down drops the table and every record\n\n"+
		"up and down are serialized with every instance's Migrate by an advisory lock.")
	d.register(fs, 5*time.Minute)
	yes := fs.Bool("yes", false, "down: confirm rolling back (required)")
	if err := parse(fs, args, true); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want exactly one of up, status, down")
	}
	action := fs.Arg(0)
	switch action {
	case "up", "status", "down":
	default:
		return usagef("unknown action %q: want up, status or down", action)
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
		// postgres.Migrate is what the services run; its error names the cause.
		if err := postgres.Migrate(b.ctx, b.pool, d.options()...); err != nil {
			return err
		}
		st, err := pgmigrate.Status(b.ctx, b.pool, fsys, d.target())
		if err != nil {
			return err
		}
		last := st.Migrations[len(st.Migrations)-1]
		fmt.Fprintf(e.stdout, "up to date: version %d (%s)\n", last.Version, last.Name)
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
