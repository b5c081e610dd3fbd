package claim

import (
	"context"
	"time"
)

// A sweep deletes in batches of defaultSweepBatch records per statement
// (the Claimer's sweepBatch; tests make it smaller), so a large backlog never
// holds locks for long, and at most sweepMaxBatches batches.
const (
	defaultSweepBatch = 1000
	sweepMaxBatches   = 100
)

// Sweep deletes finished (and released) records past their retention, in
// batches of 1,000 per statement so a large backlog never holds locks for
// long, until a batch comes back short or 100,000 records were deleted. It
// returns how many records it deleted. ctx bounds the sweep. Processing and
// uncertain records are never deleted: they show in the store's Stats (and
// the oncekey.records.expired_stuck metric) for someone to look at.
func (c *Claimer[TTx]) Sweep(ctx context.Context) (int, error) {
	total := 0
	for range sweepMaxBatches {
		n, err := c.store.Sweep(ctx, c.cfg.sweepBatch)
		total += n
		if err != nil {
			return total, wrap("sweep", err)
		}
		if n < c.cfg.sweepBatch {
			break
		}
	}
	return total, nil
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
			c.log.Warn("oncekey: sweep failed", "err", err, "deleted", n)
		} else if n > 0 {
			c.log.Debug("oncekey: swept expired records", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
