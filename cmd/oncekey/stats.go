package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oncekey/oncekey/durable"
)

// statsJSON is the -json form of stats.
type statsJSON struct {
	Processing         int64   `json:"processing"`
	Completed          int64   `json:"completed"`
	Failed             int64   `json:"failed"`
	Uncertain          int64   `json:"uncertain"`
	Released           int64   `json:"released"`
	OldestUnexpiredSec float64 `json:"oldest_unexpired_seconds"`
	StaleProcessing    int64   `json:"stale_processing"`
	ExpiredUnswept     int64   `json:"expired_unswept"`
	ExpiredStuck       int64   `json:"expired_stuck"`
	Takeovers          int64   `json:"takeovers"`
	// Durable reports whether a commit the database acknowledged survives
	// a crash and a failover; DurabilityProblems names, when not, each
	// setting that can lose one and the value to set (Stats.Durability).
	Durable            bool   `json:"durable"`
	DurabilityProblems string `json:"durability_problems,omitempty"`
}

func runStats(e *env, args []string) error {
	var d dbFlags
	fs := newFlags(e, "stats", "stats [flags]\n\nRecords by state, the oldest unexpired record's age, stale processing records\n"+
		"(lease expired, not taken over), expired records awaiting sweep, expired records stuck\n"+
		"unfinished (never swept: look at them), takeovers, and whether the database keeps the commits\n"+
		"it acknowledges (synchronous_commit, fsync, full_page_writes, synchronous standbys). From the store's Stats.")
	d.register(fs, 30*time.Second)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	b, s, err := d.openStats(e, "stats")
	if err != nil {
		return err
	}
	defer b.Close()
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(statsJSON{
			Processing: s.ByState[durable.Processing], Completed: s.ByState[durable.Completed],
			Failed: s.ByState[durable.Failed], Uncertain: s.ByState[durable.Uncertain],
			Released: s.Released, OldestUnexpiredSec: s.OldestUnexpiredAge.Seconds(),
			StaleProcessing: s.StaleProcessing, ExpiredUnswept: s.ExpiredUnswept,
			ExpiredStuck: s.ExpiredStuck, Takeovers: s.Takeovers,
			Durable: s.Durability == "", DurabilityProblems: s.Durability,
		})
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	for _, st := range []durable.State{durable.Processing, durable.Completed, durable.Failed, durable.Uncertain} {
		fmt.Fprintf(w, "%s\t%d\n", st, s.ByState[st])
	}
	fmt.Fprintf(w, "released\t%d\n", s.Released)
	fmt.Fprintf(w, "oldest unexpired\t%s\n", s.OldestUnexpiredAge.Round(time.Second))
	fmt.Fprintf(w, "stale processing\t%d\n", s.StaleProcessing)
	fmt.Fprintf(w, "expired, awaiting sweep\t%d\n", s.ExpiredUnswept)
	fmt.Fprintf(w, "expired, stuck unfinished\t%d\n", s.ExpiredStuck)
	fmt.Fprintf(w, "takeovers\t%d\n", s.Takeovers)
	if s.Durability == "" {
		fmt.Fprintf(w, "durability\tok (acknowledged commits survive a crash and a failover)\n")
	} else {
		fmt.Fprintf(w, "durability\tAT RISK: %s\n", s.Durability)
	}
	return w.Flush()
}

// openStats opens the database (see openTables) and reads the store's
// Stats; cmd names the command in a store error. The caller closes the
// database.
func (d *dbFlags) openStats(e *env, cmd string) (*db, durable.Stats, error) {
	b, err := d.openTables(e, nil, false)
	if err != nil {
		return nil, durable.Stats{}, err
	}
	s, err := b.store.Stats(b.ctx)
	if err != nil {
		b.Close()
		return nil, s, storeErr(cmd, err)
	}
	return b, s, nil
}

func runSweep(e *env, args []string) error {
	var d dbFlags
	fs := newFlags(e, "sweep", "sweep [flags]\n\nDeletes finished and released records past their retention, in batches of\n"+
		"-batch (the store's Sweep: FOR UPDATE SKIP LOCKED, never blocking claims), until a\n"+
		"batch finds fewer or -max-batches ran. Processing and uncertain records are never deleted.\n"+
		"Progress goes to stderr, the final count to stdout.")
	d.register(fs, 10*time.Minute)
	batch := fs.Int("batch", 1000, "records deleted per batch (1 to 100000)")
	maxBatches := fs.Int("max-batches", 0, "stop after this many batches (0: until done)")
	dry := fs.Bool("dry-run", false, "delete nothing: print how many records are past retention")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if *batch < 1 || *batch > 100000 {
		return usagef("-batch must be 1 to 100000, got %d", *batch)
	}
	if *maxBatches < 0 {
		return usagef("-max-batches must not be negative")
	}
	b, s, err := d.openStats(e, "sweep")
	if err != nil {
		return err
	}
	defer b.Close()
	if *dry {
		fmt.Fprintf(e.stdout, "dry run: %d records past retention would be deleted (those created in the last ~2 minutes are held back until their generation ages)\n", s.ExpiredUnswept)
		return nil
	}
	total := s.ExpiredUnswept
	swept := 0
	for n := 0; *maxBatches == 0 || n < *maxBatches; n++ {
		k, err := b.store.Sweep(b.ctx, *batch)
		if err != nil {
			fmt.Fprintln(e.stderr)
			fmt.Fprintf(e.stdout, "swept %d records before the error\n", swept)
			return storeErr("sweep", err)
		}
		swept += k
		progress(e, swept, total)
		if k < *batch {
			break
		}
	}
	fmt.Fprintln(e.stderr)
	fmt.Fprintf(e.stdout, "swept %d records\n", swept)
	return nil
}

// progress draws a bar on stderr: swept of about total.
func progress(e *env, swept int, total int64) {
	const width = 30
	if total < int64(swept) {
		total = int64(swept)
	}
	fill := width
	if total > 0 {
		fill = int(int64(swept) * width / total)
	}
	fmt.Fprintf(e.stderr, "\r[%s%s] %d/%d", strings.Repeat("#", fill), strings.Repeat(".", width-fill), swept, total)
}
