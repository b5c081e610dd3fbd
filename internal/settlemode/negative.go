//go:build oncekey_negative

package settlemode

import "sync/atomic"

var current atomic.Int32

// Current is the mode every engine of the process settles in.
func Current() Mode { return Mode(current.Load()) }

// Break makes every engine of the process settle as m until the returned
// function restores the previous mode. It exists only in builds with
// -tags oncekey_negative.
func Break(m Mode) (restore func()) {
	old := current.Swap(int32(m))
	return func() { current.Store(old) }
}
