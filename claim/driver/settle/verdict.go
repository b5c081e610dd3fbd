package settle

import (
	"errors"
	"fmt"

	"github.com/oncekey/oncekey/claim"
)

// Verdict is the one reading of a [Report] that a transport answers from.
// Each transport switches on [Report.Verdict] once, naming every value and
// no default: a verdict added here fails TestVerdictsHandledEverywhere
// until every transport answers it.
type Verdict int

const (
	// Recorded: the completion or the business failure is recorded:
	// answer with the handler's own answer (what every replay returns).
	Recorded Verdict = iota + 1
	// RecordedUncertain: the outcome is recorded as unknown; a Reconciler
	// or an operator decides. Answer "uncertain", never the handler's
	// answer.
	RecordedUncertain
	// RecordedRelease: on the application's word that nothing happened,
	// the key was given back: the next request runs it.
	RecordedRelease
	// Lost: another worker holds the operation (the lease was taken over
	// while the work ran, or the fenced write was refused). Nothing of this
	// run was written; its answer must not be published: answer "in
	// progress", the other run's outcome is the operation's.
	Lost
	// Pending: the outcome is not recorded yet and is being recorded after
	// the answer (the store was unavailable): answer "processed, not
	// recorded yet; retry with the same key".
	Pending
	// ReleasePending: the release could not be written; the lease will
	// lapse and the next request runs, so "not processed" is the truth.
	ReleasePending
	// RanOut: the lease ran out before the outcome could be recorded; the
	// record stays processing, and after the lease a takeover (or the
	// Reconciler) decides.
	RanOut
	// Unrecorded: the store refused the write with another error: the
	// work was done but its outcome could not be recorded.
	Unrecorded
)

// Verdicts lists every verdict, in order.
func Verdicts() []Verdict {
	return []Verdict{Recorded, RecordedUncertain, RecordedRelease, Lost, Pending, ReleasePending, RanOut, Unrecorded}
}

func (v Verdict) String() string {
	switch v {
	case Recorded:
		return "recorded"
	case RecordedUncertain:
		return "recorded-uncertain"
	case RecordedRelease:
		return "recorded-release"
	case Lost:
		return "lost"
	case Pending:
		return "pending"
	case ReleasePending:
		return "release-pending"
	case RanOut:
		return "ran-out"
	case Unrecorded:
		return "unrecorded"
	}
	return fmt.Sprintf("settle.Verdict(%d)", int(v))
}

// Cause is the error behind a verdict other than the Recorded ones: the
// lost lease's, or the write's; nil when recorded.
func (r Report) Cause() error {
	if r.Lost != nil {
		return r.Lost
	}
	return r.Err
}

// Verdict reads r once, for every transport alike.
func (r Report) Verdict() Verdict {
	switch {
	case r.Lost != nil:
		return Lost
	case r.Err == nil:
		switch r.Settlement.Kind {
		case Uncertain:
			return RecordedUncertain
		case Release:
			return RecordedRelease
		}
		return Recorded
	case errors.Is(r.Err, claim.ErrFenced):
		return Lost
	case errors.Is(r.Err, ErrPending) && r.Settlement.Kind == Release:
		return ReleasePending
	case errors.Is(r.Err, ErrPending):
		return Pending
	case errors.Is(r.Err, ErrLeaseRanOut):
		return RanOut
	}
	return Unrecorded
}
