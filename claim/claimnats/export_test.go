package claimnats

import "time"

// SetProgressEvery sets how often Run keeps its message in progress, until
// restore.
func SetProgressEvery(d time.Duration) (restore func()) {
	old := progressEvery.Swap(int64(d))
	return func() { progressEvery.Store(old) }
}
