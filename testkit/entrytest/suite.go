package entrytest

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The windows, by name: the keys of Caps.NotApplicable.
const (
	OutageShort  = "StoreOutageAtCompletionShorterThanTheLease"
	OutageLong   = "StoreOutageAtCompletionLongerThanTheLease"
	Renewals     = "RenewalsFailWhileTheWorkRuns"
	Panic        = "PanicAfterTheEffect"
	CallerGone   = "CallerGoneMidWork"
	Oversized    = "OversizedResult"
	Duplicate    = "DuplicateDuringTheWork"
	Mismatch     = "SameKeyOtherPayload"
	RedisEmptied = "RedisEmptiedBetweenAttempts"
	Resolve      = "OperatorResolveThenReplay"
	LongWork     = "LongWorkPastTheTransportTimer"
)

// The finished-burst windows (issue 43): bursts of concurrent retries of a
// finished operation whose result Redis does not hold. Each must be
// answered as a replay: a finished operation is never in progress.
const (
	BurstTooLarge  = "FinishedBurstResultTooLargeForRedis"
	BurstRedisLost = "FinishedBurstRedisLost"
	BurstRedisDown = "FinishedBurstRedisDown"
)

// windows is the table: every window, in order.
var windows = []struct {
	name string
	fn   func(w *world)
}{
	{OutageShort, outageShort},
	{OutageLong, outageLong},
	{Renewals, renewalsFail},
	{Panic, panicAfterEffect},
	{CallerGone, callerGone},
	{Oversized, oversized},
	{Duplicate, duplicate},
	{Mismatch, mismatch},
	{RedisEmptied, redisEmptied},
	{BurstTooLarge, finishedBurstTooLarge},
	{BurstRedisLost, finishedBurstRedisLost},
	{BurstRedisDown, finishedBurstRedisDown},
	{Resolve, resolve},
	{LongWork, longWork},
}

// Windows returns the names of every window, in the suite's order.
func Windows() []string {
	names := make([]string, len(windows))
	for i, w := range windows {
		names[i] = w.name
	}
	return names
}

// Violation is one breach of the rule after start that a window saw.
type Violation struct {
	Window string
	Key    string
	What   string
}

func (v Violation) String() string {
	if v.Key == "" {
		return v.Window + ": " + v.What
	}
	return v.Window + " " + v.Key + ": " + v.What
}

func (w *world) violate(key, format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.vs = append(w.vs, Violation{Window: w.name, Key: key, What: fmt.Sprintf(format, args...)})
}

func (w *world) violations() []Violation {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.vs)
}

// Run runs every window against the adapter d drives, each in its own
// parallel subtest with a world of its own (schema, proxy, Redis prefix,
// adapter), and fails each subtest with the violations it saw. A window
// the driver declares not applicable logs its reason and checks nothing.
//
// Run must not run beside a negative control ([Catch]) of the same
// process: a broken settlement is the whole process's.
func Run(t *testing.T, d Driver) {
	caps := d.Caps()
	for name := range caps.NotApplicable {
		if !slices.Contains(Windows(), name) {
			t.Fatalf("entrytest: Caps.NotApplicable names no window: %q", name)
		}
	}
	for _, win := range windows {
		t.Run(win.name, func(t *testing.T) {
			if reason, ok := caps.NotApplicable[win.name]; ok {
				t.Logf("not applicable: %s", reason)
				return
			}
			t.Parallel()
			start := time.Now()
			for _, v := range runWindow(t, d, win.name) {
				t.Error(v)
			}
			t.Logf("window took %v", time.Since(start).Round(time.Millisecond))
		})
	}
}

// Catch runs the window named window against d with the process's
// settlement broken by brk (which returns the function that restores it),
// and fails t unless the suite reports a violation: the negative control
// that shows the window catches that breakage. It returns the violations.
func Catch(t *testing.T, d Driver, window string, brk func() (restore func())) []Violation {
	t.Helper()
	if reason, ok := d.Caps().NotApplicable[window]; ok {
		t.Fatalf("entrytest: a negative control needs window %s, which the driver declares not applicable: %s", window, reason)
	}
	restore := brk()
	vs := func() []Violation {
		defer restore() // before the window's cleanups, and on t.Fatal too
		return runWindow(t, d, window)
	}()
	if len(vs) == 0 {
		t.Errorf("the broken settlement went unnoticed: window %s reported no violation", window)
	}
	for _, v := range vs {
		t.Logf("caught: %v", v)
	}
	return vs
}

func runWindow(t *testing.T, d Driver, name string) []Violation {
	t.Helper()
	i := slices.IndexFunc(windows, func(w struct {
		name string
		fn   func(w *world)
	}) bool {
		return w.name == name
	})
	if i < 0 {
		t.Fatalf("entrytest: no window %q", name)
	}
	lease := Lease
	if name == Renewals {
		lease = renewalsLease
	}
	w := newWorld(t, d, name, lease)
	windows[i].fn(w)
	return w.violations()
}
