package claim

import (
	"context"
	"time"

	"github.com/oncekey/oncekey/internal/logkeys"
)

// A sweep deletes in batches of defaultSweepBatch records per statement
// (the Claimer's sweepBatch; tests make it smaller), so a large backlog never
// holds locks for long, and at most sweepMaxBatches batches. After each full
// batch it pauses sweepPause times as long as the batch took, so that it
// spends at most a quarter of its time deleting: a backlog then costs the
// claims running beside it a steady trickle of work rather than a burst
// (the bench's sweep workload measures the claims' p99 with and without).
// At about 16,000 rows/s unpaced on two shared cores, that is still about
// 4,000 rows/s, more than the fresh claims the same machine can create.
const (
	defaultSweepBatch = 1000
	sweepMaxBatches   = 100
	sweepPause        = 3
)

// Sweep deletes finished (and released) records past their retention, in
// batches of 1,000 per statement so a large backlog never holds locks for
// long, until a batch comes back short or 100,000 records were deleted.
// Between batches it pauses three times as long as the last batch took, so
// it spends at most a quarter of its time deleting and a backlog does not
// crowd out the claims running beside it. It returns how many records it
// deleted. ctx bounds the sweep (pauses included); when it ends, Sweep
// returns what it deleted so far and ctx's error. Processing and uncertain
// records are never deleted: they show in the store's Stats (and the
// oncekey.records.expired_stuck metric) for someone to look at.
func (c *Claimer[TTx]) Sweep(ctx context.Context) (int, error) {
	c.checkSettings()
	total := 0
	for i := range sweepMaxBatches {
		start := time.Now()
		n, err := c.store.Sweep(ctx, c.cfg.sweepBatch)
		total += n
		if err != nil {
			return total, wrap("sweep", err)
		}
		if n < c.cfg.sweepBatch || i == sweepMaxBatches-1 {
			break
		}
		if err := c.sweepSleep(ctx, sweepPause*time.Since(start)); err != nil {
			return total, err
		}
	}
	return total, nil
}

// sweepSleep waits d or until ctx is done, and returns ctx's error then.
func (c *Claimer[TTx]) sweepSleep(ctx context.Context, d time.Duration) error {
	if c.pause != nil {
		return c.pause(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// RunSweeper runs [Claimer.Sweep] every interval (a minute suits most
// deployments) until ctx is done, and returns nil then. Failed sweeps are
// logged and retried at the next interval. Run one per deployment, or one
// per process: concurrent sweeps are safe. Errors: [ErrConfig] for an
// interval that is not positive.
func (c *Claimer[TTx]) RunSweeper(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return configErr("RunSweeper: interval must be positive, got %v", every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if n, err := c.Sweep(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("oncekey: sweep failed", logkeys.Err, err, logkeys.Deleted, n)
		} else if n > 0 {
			c.log.Debug("oncekey: swept expired records", logkeys.Deleted, n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
