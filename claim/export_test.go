package claim

import (
	"context"
	"time"
)

// WithSweepBatch sets how many records one statement of a sweep deletes, so
// a test exercises several batches with few records.
func WithSweepBatch(n int) Option {
	return func(cfg *config) error {
		cfg.sweepBatch = n
		return nil
	}
}

// SetSweepPause replaces the pause between a sweep's batches, so a test
// sees the pauses asked for without waiting them.
func SetSweepPause[TTx any](c *Claimer[TTx], f func(ctx context.Context, d time.Duration) error) {
	c.pause = f
}

// SetBreakerLogClock replaces the clock of c's warnings about the Redis
// breaker, so a test sees their rate limit without waiting it. Call it
// before c's first claim.
func SetBreakerLogClock[TTx any](c *Claimer[TTx], now func() time.Time) {
	c.breaker.now = now
}

// SetGuess sets c's guess of whether keys Redis did not grant are new
// (newGuess): 32 sends the plain insert first, -32 makes Do read first,
// 0 is where a Claimer starts.
func SetGuess[TTx any](c *Claimer[TTx], score int32) { c.newKeyGuess.score.Store(score) }

// SetMaxBehind replaces the bound of c's Redis completions sent after Do's
// answer (maxBehind), so a test reaches it with few operations. Call it
// before c's first Do.
func SetMaxBehind[TTx any](c *Claimer[TTx], n int) { c.behind = make(chan struct{}, n) }

// Watching returns how many duplicates of r wait in c on a confirmed
// subscription to its key's wakes (WithWait).
func Watching[TTx any](c *Claimer[TTx], r Request) int {
	t, _, err := c.prepare(r)
	if err != nil || c.scripts == nil {
		return 0
	}
	return c.scripts.Watching(t.keys)
}
