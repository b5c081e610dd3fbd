package claim

// WithSweepBatch sets how many records one statement of a sweep deletes, so
// a test exercises several batches with few records.
func WithSweepBatch(n int) Option {
	return func(cfg *config) error {
		cfg.sweepBatch = n
		return nil
	}
}
