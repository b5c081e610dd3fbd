package check

import (
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/oncekey/oncekey/chaos/internal/history"
)

// observer, when set, gets every Check's input and report (SetObserver).
var observer atomic.Pointer[func(Input, Report)]

// SetObserver makes every later [Check] call f with its input and its
// finished report, until the returned function puts the previous observer
// back. The runner calls Check once per scenario, scenarios possibly at
// once, so f must be safe for concurrent use. The chaos command uses it to
// keep the calls of the operations that broke an invariant, for
// [Visualize]: the runner's report names them but does not carry them.
func SetObserver(f func(Input, Report)) (restore func()) {
	var p *func(Input, Report)
	if f != nil {
		p = &f
	}
	prev := observer.Swap(p)
	return func() { observer.Store(prev) }
}

func observe(in Input, rep Report) {
	if f := observer.Load(); f != nil {
		(*f)(in, rep)
	}
}

// The verdicts of [Visualize].
const (
	VerdictLinearizable    = "linearizable"
	VerdictNotLinearizable = "not linearizable"
	VerdictInconclusive    = "inconclusive (search timed out)"
)

// Visualize writes porcupine's visualization of calls (an HTML page with
// its script and data inline) to w, and returns porcupine's verdict on
// them. The calls are checked as [Check] checks them, with the same model,
// one partition per logical operation (key and epoch), timed-out calls
// given an open end; the page shows each client's calls on a time line,
// the longest sequential executions of the record porcupine found, the
// record's state after each step and, when no execution explains every
// call, where they stop. Calls that cannot change the record (no effect,
// fenced) are left out of the search, as Check leaves them out, and drawn
// as annotations on their client's line; notes (the violations found) are
// drawn as annotations of the checker after the last call. timeout bounds
// the search (0: none).
//
// Operations, results and owners are named as the history names them (the
// suite's own keys, body hashes, token owners), never by a raw key.
func Visualize(w io.Writer, calls []history.Call, notes []Violation, timeout time.Duration) (string, error) {
	var (
		ops  []porcupine.Operation
		anns []porcupine.Annotation
		last int64
	)
	for _, c := range calls {
		last = max(last, int64(c.End))
		if !informative(c) {
			anns = append(anns, porcupine.Annotation{
				ClientId: c.Client, Start: int64(c.Start), End: int64(c.End),
				Description: fmt.Sprintf("%s %s", c.Op(), c.Kind), Details: callDetails(c),
				BackgroundColor: "#e8e8e8",
			})
			continue
		}
		end := int64(c.End)
		if c.Ambiguous {
			end = math.MaxInt64
		}
		ops = append(ops, porcupine.Operation{ClientId: c.Client, Input: c, Call: int64(c.Start), Return: end, Metadata: callDetails(c)})
	}
	for _, v := range notes {
		anns = append(anns, porcupine.Annotation{
			Tag: "checker", Start: last, Description: v.Invariant, Details: v.Detail,
			TextColor: "#ffffff", BackgroundColor: "#c0392b",
		})
	}
	m := model()
	res, info := porcupine.CheckOperationsVerbose(m, ops, timeout)
	info.AddAnnotations(anns)
	if err := porcupine.Visualize(m, info, w); err != nil {
		return "", err
	}
	switch res {
	case porcupine.Ok:
		return VerdictLinearizable, nil
	case porcupine.Illegal:
		return VerdictNotLinearizable, nil
	}
	return VerdictInconclusive, nil
}

// callDetails is the tooltip of a call: what the history knows about it.
func callDetails(c history.Call) string {
	s := fmt.Sprintf("%s: call %d, client %d, %s", c.Op(), c.ID, c.Client, c.Kind)
	if c.Ambiguous {
		s += " (ambiguous: may or may not have applied)"
	}
	s += fmt.Sprintf(", generation %d owner %.8s", c.Token.Generation, c.Token.Owner)
	if c.Body != "" {
		s += fmt.Sprintf(", body %.12s", c.Body)
	}
	if c.Status != 0 {
		s += fmt.Sprintf(", status %d", c.Status)
	}
	s += fmt.Sprintf(", %v to %v", c.Start.Round(time.Microsecond), c.End.Round(time.Microsecond))
	if c.Note != "" {
		s += ": " + c.Note
	}
	return s
}

// describeState describes the model's record for the visualization.
func describeState(s record) string {
	if s == (record{}) {
		return "no claim"
	}
	owner := fmt.Sprintf("%.8s", s.owner)
	if s.owner == phantom {
		owner = "unknown (an ambiguous claim)"
	}
	d := fmt.Sprintf("gen %d owner %s", s.gen, owner)
	if s.done {
		d += fmt.Sprintf(", done by gen %d with body %.8s", s.by.Generation, s.body)
	}
	return d
}
