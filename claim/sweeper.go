package claim

import (
	"context"
	"errors"
	"time"
)

// SweeperOptions configure [Claimer.Sweep] and [Claimer.RunSweeper].
type SweeperOptions struct {
	// Interval between sweeps in RunSweeper. Defaults to 1 minute.
	Interval time.Duration
	// Batch bounds the records deleted per statement, so a large backlog
	// never holds locks for long. Defaults to 1000.
	Batch int
	// MaxBatches bounds the batches of one sweep. Defaults to 100.
	MaxBatches int
}

func (o *SweeperOptions) defaults() error {
	if o.Interval == 0 {
		o.Interval = time.Minute
	}
	if o.Batch == 0 {
		o.Batch = 1000
	}
	if o.MaxBatches == 0 {
		o.MaxBatches = 100
	}
	if o.Interval < 0 || o.Batch < 0 || o.MaxBatches < 0 {
		return errors.New("claim: sweeper options must be positive")
	}
	return nil
}

// Sweep deletes finished (and released) records past their retention, in
// batches of opts.Batch, until a batch comes back short or opts.MaxBatches
// ran. It returns how many records it deleted. Processing and uncertain
// records are never deleted: they show in the store's Stats (and the
// oncekey.records.expired_stuck metric) for someone to look at.
func (c *Claimer[TTx]) Sweep(ctx context.Context, opts SweeperOptions) (int, error) {
	if err := opts.defaults(); err != nil {
		return 0, err
	}
	total := 0
	for range opts.MaxBatches {
		n, err := c.store.Sweep(ctx, opts.Batch)
		total += n
		if err != nil {
			return total, wrap("sweep", err)
		}
		if n < opts.Batch {
			break
		}
	}
	return total, nil
}

// RunSweeper sweeps every opts.Interval until ctx is done, and returns nil
// then. Failed sweeps are logged and retried at the next interval.
func (c *Claimer[TTx]) RunSweeper(ctx context.Context, opts SweeperOptions) error {
	if err := opts.defaults(); err != nil {
		return err
	}
	t := time.NewTicker(opts.Interval)
	defer t.Stop()
	for {
		if n, err := c.Sweep(ctx, opts); err != nil && ctx.Err() == nil {
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
