//go:build !oncekey_negative

package settlemode

// Current is the mode every engine of the process settles in: Correct,
// always, in a build without -tags oncekey_negative.
func Current() Mode { return Correct }
