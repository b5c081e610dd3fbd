package main

import (
	"context"
	"time"
)

// workload is one scenario: its variants run in alternation.
type workload struct {
	name, about string
	variants    []*variant
	// prepare runs once, untimed, before the rounds.
	prepare func(ctx context.Context) error
	// finish runs after the rounds and returns the workload's own figures
	// and checks; a failed check is an extra with failed set.
	finish func(ctx context.Context) ([]extra, error)
	// measure, when set, runs instead of the closed-loop rounds: the
	// workload times its variants itself (bursts released together, a
	// holder and its waiters) and books them into their stats
	// (alternateSides), so they are reported like any other variant.
	measure func(ctx context.Context) error
}

// extra is a workload's own figure or check, printed under the table.
type extra struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit,omitempty"`
	Target string  `json:"target,omitempty"` // as text: "<= 1.05"
	Meets  *bool   `json:"meets,omitempty"`  // against Target
	Check  bool    `json:"check,omitempty"`  // a correctness check: failing it fails the run
	Failed bool    `json:"failed,omitempty"` // the check failed
	Note   string  `json:"note,omitempty"`
	// Bound says, for a missed target, what bounds it in this run; it is
	// printed among the workload's "missed" lines.
	Bound string `json:"bound,omitempty"`
}

// plan returns how runRounds splits a workload of n variants: the number
// of timed rounds each variant gets and their length. Each variant's
// share of -duration is split into the count of -round long rounds nearest
// to it (at least one), so a share of 1.7 rounds gives two rounds, not one:
// fresh's 23 variants get two rounds of 217ms from -duration 10s at the
// default -round 250ms, four of 109ms at -round 100ms.
func plan(cfg config, n int) (rounds int, length time.Duration) {
	per := cfg.duration / time.Duration(n)
	rounds = max(1, int((per+cfg.round/2)/cfg.round))
	return rounds, per / time.Duration(rounds)
}

func boolp(b bool) *bool { return &b }
