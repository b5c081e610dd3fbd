package check

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/chaos/internal/history"
)

// The invariants, as named in a [Violation].
const (
	// AtMostOneEffect: no logical operation has more than one business
	// effect.
	AtMostOneEffect = "at-most-one-effect"
	// AckedOneEffect: every operation acknowledged as a success has exactly
	// one effect, and it is the one whose result is replayed; a stored
	// business rejection has none.
	AckedOneEffect = "acked-has-one-effect"
	// ReplaysIdentical: every answer an operation gave carries the same
	// body, byte for byte.
	ReplaysIdentical = "replays-identical"
	// GenerationMonotonic: a record's durable generation, sampled while
	// the scenario ran, never decreased.
	GenerationMonotonic = "generation-monotonic"
	// OneOwnerPerGeneration: no two owners ever held or completed under one
	// generation of a key (from the clients' tokens and from what the
	// downstream was presented).
	OneOwnerPerGeneration = "one-owner-per-generation"
	// NoStaleCompletion: no completion was accepted from a token after a
	// higher generation of the key had been granted.
	NoStaleCompletion = "no-stale-completion"
	// Linearizable: the calls of each operation are explained by one
	// sequential execution of the record (porcupine).
	Linearizable = "linearizable"
	// AckedDurable: every acknowledged result is still in the database at
	// the end, with the same body: no acknowledged result was lost.
	AckedDurable = "acked-result-durable"
	// StuckReported: processing and uncertain records past their retention
	// are counted by Stats and never deleted by the sweeper.
	StuckReported = "stuck-reported-not-deleted"
	// RetentionNewOperation: a key retried after its retention window runs
	// as a new operation (one new effect, a new result), as documented;
	// the old result is not replayed.
	RetentionNewOperation = "retention-new-operation"
	// FinishedNotInProgress: a call sent after its operation's completion
	// or failure was acknowledged (or its stored result replayed) is never
	// answered "in progress" or "uncertain": a finished operation replays,
	// whatever Redis holds of it (issue 43).
	FinishedNotInProgress = "finished-never-in-progress"
	// OneRunAtATime: two runs of Do's function for one operation never
	// overlap in time when both ran in a transaction that holds the key's
	// lock (Do without WithWriteAtCommit: the lock first, or the claim's):
	// no such run starts while another one runs whose transaction is known
	// to have lived through it (it committed, or its record's write was
	// answered). A duplicate waits for the holder's COMMIT and never runs
	// the function beside it, with or without Redis (issue 44).
	OneRunAtATime = "one-fn-run-at-a-time"
)

// Input is everything the checker reads. It comes from the history and the
// database, never from the library's own counters.
type Input struct {
	Calls []history.Call
	// Runs are the runs of Do's business function, as the process saw
	// them.
	Runs    []history.Run
	Effects []history.Effect
	// Records are the durable records at the end, read with plain SQL.
	Records []history.Record
	// Samples of the durable generations taken while the scenario ran.
	Samples []history.Sample
	// DownstreamConflicts lists generations the downstream saw presented
	// by two owners.
	DownstreamConflicts []string
	// Swept lists keys whose records the sweeper was entitled to delete
	// (finished and past retention): their records are not expected.
	Swept map[string]bool
	// Stuck, when set, is what the scenario learned about stuck records.
	Stuck *Stuck
	// Extra are violations a scenario found itself (its own invariant).
	Extra []Violation
}

// Stuck describes processing and uncertain records past their retention.
type Stuck struct {
	// Found are the keys found stuck with plain SQL before the sweep.
	Found []string
	// Reported is Stats().ExpiredStuck before the sweep.
	Reported int64
	// Left are the keys of Found still present after the sweep.
	Left []string
}

// Options configure [Check].
type Options struct {
	// Timeout bounds porcupine's search per operation. Defaults to 5s.
	Timeout time.Duration
}

// Violation is one broken invariant. The runner hands it to its users as
// chaos.Violation, which has the same fields and prints it.
type Violation struct {
	Invariant string `json:"invariant"`
	Op        string `json:"op,omitempty"`
	Detail    string `json:"detail"`
}

// Report is the checker's verdict.
type Report struct {
	Violations []Violation `json:"violations"`
	// Operations is the number of logical operations (key and epoch) seen.
	Operations int `json:"operations"`
	// Acknowledged is how many of them a client got a result for.
	Acknowledged int `json:"acknowledged"`
	// Linearized and Inconclusive count porcupine's partitions checked and
	// those whose search hit the timeout (reported, not counted as
	// violations).
	Linearized   int `json:"linearized"`
	Inconclusive int `json:"inconclusive"`
}

// OK reports whether no invariant was broken.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// Check verifies every invariant on in.
func Check(in Input, opts Options) Report {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	var rep Report
	add := func(inv, op, format string, args ...any) {
		rep.Violations = append(rep.Violations, Violation{Invariant: inv, Op: op, Detail: fmt.Sprintf(format, args...)})
	}

	ops := map[string]bool{}
	acks := map[string][]history.Call{}
	for _, c := range in.Calls {
		ops[c.Op()] = true
		if IsAck(c) {
			acks[c.Op()] = append(acks[c.Op()], c)
		}
	}
	effects := map[string][]history.Effect{}
	for _, e := range in.Effects {
		op := history.OpName(e.Key, e.Epoch)
		ops[op] = true
		effects[op] = append(effects[op], e)
	}
	rep.Operations, rep.Acknowledged = len(ops), len(acks)

	// At most one effect per logical operation.
	for _, op := range sortedKeys(effects) {
		if es := effects[op]; len(es) > 1 {
			var d []string
			for _, e := range es {
				d = append(d, fmt.Sprintf("gen %d owner %.8s via %s", e.Generation, e.Owner, e.Via))
			}
			add(AtMostOneEffect, op, "%d effects: %s", len(es), strings.Join(d, "; "))
		}
	}

	// Acknowledged operations: identical answers, exactly one effect (none
	// for a stored rejection), and that effect's result.
	for _, op := range sortedKeys(acks) {
		as := acks[op]
		first := as[0]
		for _, a := range as[1:] {
			if a.Body != first.Body || a.Status != first.Status {
				add(ReplaysIdentical, op, "client %d got %d/%.12s (%s), client %d got %d/%.12s (%s)",
					first.Client, first.Status, first.Body, first.Kind, a.Client, a.Status, a.Body, a.Kind)
				break
			}
		}
		es := effects[op]
		switch {
		case first.Status >= 400 && len(es) != 0:
			add(AckedOneEffect, op, "a stored rejection (%d) has %d effects", first.Status, len(es))
		case first.Status < 400 && len(es) != 1:
			add(AckedOneEffect, op, "acknowledged as success, %d effects", len(es))
		case first.Status < 400 && es[0].Body != first.Body:
			add(AckedOneEffect, op, "the effect's result %.12s is not the acknowledged %.12s", es[0].Body, first.Body)
		}
	}

	// Generations never decrease.
	samples := append([]history.Sample(nil), in.Samples...)
	history.SortSamples(samples)
	for i := 1; i < len(samples); i++ {
		p, s := samples[i-1], samples[i]
		if p.Key == s.Key && s.Generation < p.Generation {
			add(GenerationMonotonic, s.Key, "generation went from %d to %d at %v", p.Generation, s.Generation, s.At)
		}
	}

	// One owner per generation; no completion from a stale token.
	type genKey struct {
		key string
		gen uint64
	}
	owners := map[genKey]uuid.UUID{}
	reported := map[genKey]bool{}
	grants := map[string][]history.Call{} // per op: definite grants
	for _, c := range in.Calls {
		if c.Ambiguous || (c.Token.Generation == 0 && c.Token.Owner == uuid.Nil) {
			continue
		}
		switch c.Kind {
		case history.Acquire, history.Adopt, history.Execute, history.Complete:
		default:
			continue
		}
		k := genKey{c.Key, c.Token.Generation}
		if o, ok := owners[k]; ok && o != c.Token.Owner && !reported[k] {
			reported[k] = true
			add(OneOwnerPerGeneration, c.Op(), "generation %d held by owners %.8s and %.8s", k.gen, o, c.Token.Owner)
		} else if !ok {
			owners[k] = c.Token.Owner
		}
		if c.Kind != history.Complete {
			grants[c.Op()] = append(grants[c.Op()], c)
		}
	}
	for _, d := range in.DownstreamConflicts {
		add(OneOwnerPerGeneration, "", "downstream: %s", d)
	}
	for _, c := range in.Calls {
		if c.Ambiguous || (c.Kind != history.Complete && c.Kind != history.Execute) {
			continue
		}
		for _, g := range grants[c.Op()] {
			if g.Token.Generation > c.Token.Generation && g.End < c.Start {
				add(NoStaleCompletion, c.Op(), "completion under generation %d accepted at %v, after generation %d was granted at %v",
					c.Token.Generation, c.Start, g.Token.Generation, g.End)
				break
			}
		}
	}

	// A finished operation is never answered "in progress".
	finishedNeverInProgress(in.Calls, add)

	// Do's function: one run at a time per operation, under the lock.
	oneRunAtATime(in.Runs, in.Calls, in.Effects, add)

	// Linearizability, per logical operation.
	illegal, checked, unknown := linearize(in.Calls, opts.Timeout)
	rep.Linearized, rep.Inconclusive = checked, unknown
	for _, op := range illegal {
		add(Linearizable, op, "no sequential execution of the record explains its calls")
	}

	// No acknowledged result lost: the latest acknowledged epoch of each
	// key is still in the database with the same body.
	records := map[string]history.Record{}
	for _, r := range in.Records {
		records[r.Key] = r
	}
	latest := map[string]history.Call{}
	for _, op := range sortedKeys(acks) {
		a := acks[op][0]
		if l, ok := latest[a.Key]; !ok || a.Epoch > l.Epoch {
			latest[a.Key] = a
		}
	}
	for _, key := range sortedKeys(latest) {
		a := latest[key]
		if in.Swept[key] {
			continue
		}
		r, ok := records[key]
		switch {
		case !ok:
			add(AckedDurable, a.Op(), "acknowledged, but the record is gone")
		case r.State != "completed" && r.State != "failed":
			add(AckedDurable, a.Op(), "acknowledged, but the record is %s", r.State)
		case r.Body != a.Body:
			add(AckedDurable, a.Op(), "acknowledged %.12s, the record holds %.12s", a.Body, r.Body)
		}
	}

	// After retention: a new operation, not the old result.
	byKey := map[string]map[int]history.Call{}
	for _, op := range sortedKeys(acks) {
		a := acks[op][0]
		if byKey[a.Key] == nil {
			byKey[a.Key] = map[int]history.Call{}
		}
		byKey[a.Key][a.Epoch] = a
	}
	for _, key := range sortedKeys(byKey) {
		e := byKey[key]
		for epoch, a := range e {
			if prev, ok := e[epoch-1]; ok && epoch > 1 && prev.Body == a.Body {
				add(RetentionNewOperation, a.Op(), "retried after retention and got the old result back")
			}
		}
	}

	// Stuck records reported, never deleted.
	if s := in.Stuck; s != nil {
		if s.Reported < int64(len(s.Found)) {
			add(StuckReported, "", "%d stuck records found, Stats reported %d", len(s.Found), s.Reported)
		}
		left := map[string]bool{}
		for _, k := range s.Left {
			left[k] = true
		}
		for _, k := range s.Found {
			if !left[k] {
				add(StuckReported, k, "a stuck record was deleted by the sweep")
			}
		}
	}

	rep.Violations = append(rep.Violations, in.Extra...)
	observe(in, rep)
	return rep
}

// finishedNeverInProgress reports, per operation, the calls answered "in
// progress" or "uncertain" that were sent after the operation was known to
// be finished: after the answer of its first acknowledged completion or
// failure (an Execute or Complete that is not ambiguous: it applied) or of
// its first replay (a stored result came back) arrived. The order is real
// time on the recorder's one monotonic clock: the finish's End before the
// call's Start. A call that overlaps the finish may be answered either way
// and is not judged; nor is one whose finish is only possible (an ambiguous
// call), nor a call of another epoch (a later life of the key).
func finishedNeverInProgress(calls []history.Call, add func(inv, op, format string, args ...any)) {
	first := map[string]history.Call{} // per op: the finish answered first
	for _, c := range calls {
		if !finishes(c) {
			continue
		}
		if f, ok := first[c.Op()]; !ok || c.End < f.End {
			first[c.Op()] = c
		}
	}
	late := map[string][]history.Call{}
	for _, c := range calls {
		if c.Answer == "" {
			continue
		}
		if f, ok := first[c.Op()]; ok && f.End < c.Start {
			late[c.Op()] = append(late[c.Op()], c)
		}
	}
	for _, op := range sortedKeys(late) {
		cs := late[op]
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].Start < cs[j].Start })
		f, c := first[op], cs[0]
		add(FinishedNotInProgress, op, "%d calls answered in progress or uncertain after the operation finished; the first: client %d, sent at %v, answered %s, after client %d's %s was answered at %v",
			len(cs), c.Client, c.Start, c.Answer, f.Client, f.Kind, f.End)
	}
}

// oneRunAtATime reports, per operation, the locked runs of Do's function
// (see [history.Run]) that started while another locked run of it ran
// whose session is known to have lived, holding the key's lock, from
// before that run's start (recorded on entry, after the lock was granted)
// to after its end (recorded on return, before the record's write): no
// other holder of the lock can start in between. The order is real time
// on the recorder's one clock. A run is such a witness when
//
//   - its transaction committed: its effect is in the table; or
//   - it returned a result, it was its call's last run, and the call was
//     answered with a replay or a mismatch (not ambiguous): the database
//     refused its record's write (another record of the key was there),
//     which it answered, so the session was alive past the run's end; or
//     with Executed, its write committed (a business rejection too, which
//     writes no effect).
//
// Any other run is no witness: its connection may have been cut, or its
// session ended, while the function still ran in process, and the lock
// went with the session; a retry that then starts beside it is sequential
// for the database (so is a retry after a rollback, which starts after the
// run ended). Runs of the opt-in WithWriteAtCommit (not Locked), which
// hold no lock while the function runs and may overlap by design, are not
// judged.
func oneRunAtATime(runs []history.Run, calls []history.Call, effects []history.Effect, add func(inv, op, format string, args ...any)) {
	committed := map[int64]bool{}
	for _, e := range effects {
		if e.ID != 0 {
			committed[e.ID] = true
		}
	}
	callByID := map[int]history.Call{}
	for _, c := range calls {
		if c.ID != 0 {
			callByID[c.ID] = c
		}
	}
	last := map[int]history.Run{} // per call: its last run
	for _, r := range runs {
		if l, ok := last[r.Call]; r.Call != 0 && (!ok || r.Start > l.Start) {
			last[r.Call] = r
		}
	}
	witness := func(r history.Run) bool {
		if r.Effect != 0 && committed[r.Effect] {
			return true
		}
		c, ok := callByID[r.Call]
		if !ok || !r.Returned || last[r.Call] != r || c.Ambiguous {
			return false
		}
		switch c.Kind {
		case history.Replay, history.Mismatch, history.Execute:
			return true
		}
		return false
	}
	byOp := map[string][]history.Run{}
	for _, r := range runs {
		if r.Locked {
			byOp[r.Op()] = append(byOp[r.Op()], r)
		}
	}
	for _, op := range sortedKeys(byOp) {
		rs := byOp[op]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].Start < rs[j].Start })
		n := 0
		var first string
		for i, held := range rs {
			if !witness(held) {
				continue
			}
			for j, r := range rs {
				if i == j || r.Start < held.Start || r.Start > held.End {
					continue
				}
				n++
				if first == "" {
					first = fmt.Sprintf("client %d's started at %v while client %d's ran, from %v to %v",
						r.Client, r.Start, held.Client, held.Start, held.End)
				}
			}
		}
		if n > 0 {
			add(OneRunAtATime, op, "%d runs of Do's function started while another ran whose transaction lived through it (both on Do's locked path); the first: %s", n, first)
		}
	}
}

// finishes reports whether c shows its operation finished once its answer
// arrived: a completion or failure that applied, or a stored result
// replayed.
func finishes(c history.Call) bool {
	switch c.Kind {
	case history.Execute, history.Complete:
		return !c.Ambiguous
	case history.Replay:
		return true
	}
	return false
}

// IsAck reports whether a client received a result from c.
func IsAck(c history.Call) bool {
	switch c.Kind {
	case history.Execute, history.Complete:
		return !c.Ambiguous
	case history.Replay:
		return true
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
