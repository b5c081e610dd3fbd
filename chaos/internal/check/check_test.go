package check_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/fence"
)

var (
	ownerA = uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000001")
	ownerB = uuid.MustParse("bbbbbbbb-0000-4000-8000-000000000002")
	bodyA  = history.Hash([]byte(`{"by":"a"}`))
	bodyB  = history.Hash([]byte(`{"by":"b"}`))
)

func tok(gen uint64, o uuid.UUID) fence.Token { return fence.Token{Generation: gen, Owner: o} }

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func call(kind history.Kind, client int, t fence.Token, body string, start, end int) history.Call {
	return history.Call{Key: "k", Epoch: 1, Client: client, Kind: kind, Token: t, Fingerprint: "fp", Body: body, Status: 200,
		Start: ms(start), End: ms(end)}
}

func effect(t fence.Token, body string) history.Effect {
	return history.Effect{Key: "k", Epoch: 1, Owner: t.Owner, Generation: t.Generation, Body: body, Via: "test"}
}

func record(state string, gen uint64, o uuid.UUID, body string) history.Record {
	return history.Record{Key: "k", State: state, Generation: gen, Owner: o, Body: body, Status: 200}
}

// good is a correct history: owner A claims, is paused past its lease, B
// takes over and completes, A's completion is fenced, and a client replays.
func good() check.Input {
	return check.Input{
		Calls: []history.Call{
			call(history.Acquire, 0, tok(1, ownerA), "", 0, 5),
			call(history.Acquire, 1, tok(2, ownerB), "", 400, 405),
			call(history.Complete, 1, tok(2, ownerB), bodyB, 410, 415),
			call(history.Fenced, 0, tok(1, ownerA), bodyA, 900, 905),
			call(history.Replay, 2, fence.Token{}, bodyB, 950, 955),
		},
		Effects: []history.Effect{effect(tok(2, ownerB), bodyB)},
		Records: []history.Record{record("completed", 2, ownerB, bodyB)},
		Samples: []history.Sample{{Key: "k", At: ms(10), Generation: 1}, {Key: "k", At: ms(500), Generation: 2}},
	}
}

func invariants(r check.Report) []string {
	var out []string
	for _, v := range r.Violations {
		out = append(out, v.Invariant)
	}
	return out
}

func TestCheck_GoodHistoryPasses(t *testing.T) {
	r := check.Check(good(), check.Options{})
	if !r.OK() {
		t.Fatalf("violations on a correct history: %v", r.Violations)
	}
	if r.Operations != 1 || r.Acknowledged != 1 || r.Linearized != 1 {
		t.Fatalf("report = %+v", r)
	}
}

// Each broken history must be reported under the named invariant.
func TestCheck_EveryInvariantCanFail(t *testing.T) {
	for _, c := range []struct {
		name   string
		want   string
		mutate func(in *check.Input)
	}{
		{"SecondEffect", check.AtMostOneEffect, func(in *check.Input) {
			in.Effects = append(in.Effects, effect(tok(1, ownerA), bodyA))
		}},
		{"AckedWithoutEffect", check.AckedOneEffect, func(in *check.Input) { in.Effects = nil }},
		{"EffectOfAnotherResult", check.AckedOneEffect, func(in *check.Input) {
			in.Effects = []history.Effect{effect(tok(2, ownerB), bodyA)}
		}},
		{"DifferentReplay", check.ReplaysIdentical, func(in *check.Input) { in.Calls[4].Body = bodyA }},
		{"GenerationWentBack", check.GenerationMonotonic, func(in *check.Input) {
			in.Samples = append(in.Samples, history.Sample{Key: "k", At: ms(800), Generation: 1})
		}},
		{"TwoOwnersOneGeneration", check.OneOwnerPerGeneration, func(in *check.Input) {
			in.Calls[1].Token, in.Calls[2].Token = tok(1, ownerB), tok(1, ownerB)
		}},
		{"DownstreamSawTwoOwners", check.OneOwnerPerGeneration, func(in *check.Input) {
			in.DownstreamConflicts = []string{"op: generation 2 presented by two owners"}
		}},
		{"StaleCompletionAccepted", check.NoStaleCompletion, func(in *check.Input) {
			in.Calls[3].Kind = history.Complete
		}},
		{"ReplayToAnotherPayload", check.Linearizable, func(in *check.Input) {
			in.Calls[4].Fingerprint = "another payload's"
		}},
		{"ReplayBeforeAnyCompletion", check.Linearizable, func(in *check.Input) {
			in.Calls[4].Start, in.Calls[4].End = ms(100), ms(105)
		}},
		{"ResultLost", check.AckedDurable, func(in *check.Input) { in.Records = nil }},
		{"RecordStillProcessing", check.AckedDurable, func(in *check.Input) {
			in.Records = []history.Record{record("processing", 3, ownerA, "")}
		}},
		{"StuckDeleted", check.StuckReported, func(in *check.Input) {
			in.Stuck = &check.Stuck{Found: []string{"s"}, Reported: 1}
		}},
		{"StuckNotReported", check.StuckReported, func(in *check.Input) {
			in.Stuck = &check.Stuck{Found: []string{"s"}, Reported: 0, Left: []string{"s"}}
		}},
		{"InProgressAfterFinish", check.FinishedNotInProgress, func(in *check.Input) {
			in.Calls = append(in.Calls, told(history.InProgress, 420, 425))
		}},
		{"FunctionRanBesideHolder", check.OneRunAtATime, func(in *check.Input) {
			in.Effects[0].ID = 1
			in.Runs = []history.Run{run(1, true, 406, 409, 1), run(0, true, 407, 412, 2)}
		}},
		{"OldResultAfterRetention", check.RetentionNewOperation, func(in *check.Input) {
			c := call(history.Replay, 3, fence.Token{}, bodyB, 2000, 2005)
			c.Epoch = 2
			in.Calls = append(in.Calls, c)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := good()
			c.mutate(&in)
			r := check.Check(in, check.Options{})
			got := invariants(r)
			for _, g := range got {
				if g == c.want {
					return
				}
			}
			t.Fatalf("violations %v, want one of %s", got, c.want)
		})
	}
}

// An ambiguous call has an open end: the model explores both outcomes.
func TestCheck_AmbiguousCallExploresBothOutcomes(t *testing.T) {
	in := check.Input{
		Calls: []history.Call{
			// Do timed out after its function ran: did it commit?
			{Key: "k", Epoch: 1, Kind: history.Execute, Ambiguous: true, Token: tok(1, ownerA), Fingerprint: "fp", Body: bodyA, Status: 201, Start: ms(0), End: ms(50)},
			// A retry much later replays A's result: it did.
			{Key: "k", Epoch: 1, Client: 1, Kind: history.Replay, Body: bodyA, Status: 201, Start: ms(500), End: ms(505)},
		},
		Effects: []history.Effect{effect(tok(1, ownerA), bodyA)},
		Records: []history.Record{record("completed", 1, ownerA, bodyA)},
	}
	in.Records[0].Status = 201
	if r := check.Check(in, check.Options{}); !r.OK() {
		t.Fatalf("violations: %v", r.Violations)
	}
	// Had it not committed, B could run; both executing is impossible.
	in.Calls = append(in.Calls, history.Call{Key: "k", Epoch: 1, Client: 2, Kind: history.Execute, Token: tok(2, ownerB),
		Fingerprint: "fp", Body: bodyB, Status: 201, Start: ms(100), End: ms(110)})
	r := check.Check(in, check.Options{})
	if !strings.Contains(strings.Join(invariants(r), ","), check.Linearizable) {
		t.Fatalf("violations %v, want %s", invariants(r), check.Linearizable)
	}
}

func TestCheck_MismatchNeedsAnotherFingerprint(t *testing.T) {
	in := good()
	m := call(history.Mismatch, 3, fence.Token{}, "", 960, 965)
	in.Calls = append(in.Calls, m)
	if r := check.Check(in, check.Options{}); strings.Join(invariants(r), ",") != check.Linearizable {
		t.Fatalf("a mismatch for the winning fingerprint: violations %v, want %s", invariants(r), check.Linearizable)
	}
	in.Calls[len(in.Calls)-1].Fingerprint = "other"
	if r := check.Check(in, check.Options{}); !r.OK() {
		t.Fatalf("a mismatch for another fingerprint: violations %v", r.Violations)
	}
}

// told is a call of client 3 that got no result and was told a.
func told(a history.Answer, start, end int) history.Call {
	c := call(history.NoEffect, 3, fence.Token{}, "", start, end)
	c.Status, c.Answer = 0, a
	return c
}

// A call sent after its operation finished is never answered "in
// progress" or "uncertain"; one that overlaps the finish, or comes before
// it, or in another life of the key, may be. In good(), B's completion is
// answered at 415ms and the replay at 955ms.
func TestCheck_FinishedNeverInProgress(t *testing.T) {
	for _, c := range []struct {
		name  string
		call  history.Call
		fires bool
	}{
		{"InProgressAfterCompletion", told(history.InProgress, 420, 425), true},
		{"UncertainAfterCompletion", told(history.Uncertain, 420, 425), true},
		{"InProgressAfterReplay", told(history.InProgress, 960, 965), true},
		// Sent while the completion was in flight: either answer is right.
		{"OverlapsCompletion", told(history.InProgress, 412, 430), false},
		// Sent the moment the completion's answer arrived: not after it.
		{"SentAsCompletionAnswered", told(history.InProgress, 415, 420), false},
		{"BeforeCompletion", told(history.InProgress, 100, 105), false},
		// An error, a timeout: told nothing about the operation.
		{"NoAnswer", told("", 420, 425), false},
		{"AnotherLife", func() history.Call {
			c := told(history.InProgress, 2000, 2005)
			c.Epoch = 2
			return c
		}(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := good()
			in.Calls = append(in.Calls, c.call)
			r := check.Check(in, check.Options{})
			got := strings.Join(invariants(r), ",")
			switch {
			case c.fires && got != check.FinishedNotInProgress:
				t.Fatalf("violations %v, want %s alone", r.Violations, check.FinishedNotInProgress)
			case !c.fires && got != "":
				t.Fatalf("violations %v, want none", r.Violations)
			}
		})
	}
}

// A replay shows the operation finished even when its completion is only
// possible (an ambiguous Execute): a call sent after the replay's answer
// must not be told "in progress"; one sent between the ambiguous Execute
// and the replay may be.
func TestCheck_FinishedNeverInProgress_ReplayIsTheEvidence(t *testing.T) {
	in := check.Input{
		Calls: []history.Call{
			{Key: "k", Epoch: 1, Kind: history.Execute, Ambiguous: true, Token: tok(1, ownerA), Fingerprint: "fp", Body: bodyA, Status: 201, Start: ms(0), End: ms(50)},
			told(history.InProgress, 60, 65),
			{Key: "k", Epoch: 1, Client: 1, Kind: history.Replay, Fingerprint: "fp", Body: bodyA, Status: 201, Start: ms(500), End: ms(505)},
		},
		Effects: []history.Effect{effect(tok(1, ownerA), bodyA)},
		Records: []history.Record{record("completed", 1, ownerA, bodyA)},
	}
	in.Records[0].Status = 201
	if r := check.Check(in, check.Options{}); !r.OK() {
		t.Fatalf("in progress before any finish was seen: violations %v", r.Violations)
	}
	in.Calls = append(in.Calls, told(history.Uncertain, 510, 515), told(history.InProgress, 520, 525))
	r := check.Check(in, check.Options{})
	if got := strings.Join(invariants(r), ","); got != check.FinishedNotInProgress {
		t.Fatalf("violations %v, want %s once", r.Violations, check.FinishedNotInProgress)
	}
	if d := r.Violations[0].Detail; !strings.Contains(d, "2 calls") || !strings.Contains(d, "client 1's replay") {
		t.Fatalf("detail %q: want the two calls counted and the replay named as the finish", d)
	}
}

// run is a run of Do's function by client, locked or not, from start to
// end (ms), that inserted the effect with row id effect (0: none).
func run(client int, locked bool, start, end int, effect int64) history.Run {
	return history.Run{Key: "k", Epoch: 1, Client: client, Locked: locked, Start: ms(start), End: ms(end), Effect: effect}
}

// Two locked runs of Do's function for one operation never overlap: none
// starts while another runs that committed. In good(), B's effect is given
// row id 1: a run that inserted row 1 committed, any other row id did not.
// The holder is client 1's run from 406 to 409ms, which committed.
func TestCheck_OneRunAtATime(t *testing.T) {
	holder := run(1, true, 406, 409, 1)
	for _, c := range []struct {
		name  string
		runs  []history.Run
		fires bool
	}{
		// A duplicate ran beside the holder, its insert at commit failed
		// and rolled it back (do-skips-lock): nothing else shows.
		{"DuplicateBesideHolder", []history.Run{holder, run(0, true, 407, 412, 2)}, true},
		{"StartedWithTheHolder", []history.Run{holder, run(0, true, 406, 407, 2)}, true},
		// A business rejection writes no effect, and still ran beside it.
		{"RejectionBesideHolder", []history.Run{holder, run(2, true, 408, 409, 0)}, true},
		{"TwoDuplicates", []history.Run{holder, run(0, true, 407, 412, 2), run(2, true, 408, 410, 3)}, true},
		// Rolled back (its own error, a crash) before the holder started.
		{"RetryAfterRollback", []history.Run{run(0, true, 400, 405, 2), holder}, false},
		// Its session was cut while the function still ran in process:
		// the lock went with it, and the holder's start beside it is
		// sequential for the database.
		{"HolderAfterACutRun", []history.Run{run(0, true, 400, 420, 2), holder}, false},
		// Neither committed: no witness held the lock to the end.
		{"NoneCommitted", []history.Run{run(1, true, 406, 409, 9), run(0, true, 407, 412, 2)}, false},
		// WithWriteAtCommit runs the function without the lock, for
		// duplicates too: not judged, on either side.
		{"WriteAtCommitDuplicate", []history.Run{holder, run(0, false, 407, 412, 2)}, false},
		{"WriteAtCommitHolder", []history.Run{run(1, false, 406, 409, 1), run(0, true, 407, 412, 2)}, false},
		{"AfterTheHolder", []history.Run{holder, run(0, true, 410, 412, 2)}, false},
		{"AnotherLife", []history.Run{holder, func() history.Run {
			r := run(0, true, 407, 412, 2)
			r.Epoch = 2
			return r
		}()}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := good()
			in.Effects[0].ID = 1
			in.Runs = c.runs
			r := check.Check(in, check.Options{})
			got := strings.Join(invariants(r), ",")
			switch {
			case c.fires && got != check.OneRunAtATime:
				t.Fatalf("violations %v, want %s alone", r.Violations, check.OneRunAtATime)
			case !c.fires && got != "":
				t.Fatalf("violations %v, want none", r.Violations)
			}
		})
	}
}

// A run that did not commit is a witness too when its session is known to
// have lived past its end: it returned a result, it was its call's last
// run, and the call was answered with a replay or a mismatch (the
// database refused its record's write). Client 0's call (id 101) is
// answered from 405 to 420ms; its run, from 406 to 409ms, wrote effect 2,
// rolled back; client 2's run starts at 407ms.
func TestCheck_OneRunAtATime_RefusedWriteIsAWitness(t *testing.T) {
	answered := func(kind history.Kind, fp string) history.Call {
		c := call(kind, 0, fence.Token{}, bodyB, 405, 420)
		c.ID, c.Fingerprint = 101, fp
		if kind != history.Replay {
			c.Body, c.Status = "", 0
		}
		return c
	}
	held := run(0, true, 406, 409, 2)
	held.Call, held.Returned = 101, true
	dup := run(2, true, 407, 408, 3)
	for _, c := range []struct {
		name  string
		call  history.Call
		runs  []history.Run
		fires bool
	}{
		{"Replayed", answered(history.Replay, "fp"), []history.Run{held, dup}, true},
		{"Mismatch", answered(history.Mismatch, "other"), []history.Run{held, dup}, true},
		// An error after the run (a cut connection): its session may have
		// ended while the function still ran.
		{"Error", answered(history.NoEffect, "fp"), []history.Run{held, dup}, false},
		// The function failed or panicked: nothing was written after it.
		{"NotReturned", answered(history.Replay, "fp"), []history.Run{func() history.Run {
			r := held
			r.Returned = false
			return r
		}(), dup}, false},
		// Not the call's last run: the call's answer speaks of the last.
		{"NotLast", answered(history.Replay, "fp"), []history.Run{held, dup, func() history.Run {
			r := run(0, true, 430, 431, 0)
			r.Call, r.Returned = 101, true
			return r
		}()}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := good()
			in.Calls = append(in.Calls, c.call)
			in.Runs = c.runs
			r := check.Check(in, check.Options{})
			got := strings.Join(invariants(r), ",")
			switch {
			case c.fires && got != check.OneRunAtATime:
				t.Fatalf("violations %v, want %s alone", r.Violations, check.OneRunAtATime)
			case !c.fires && got != "":
				t.Fatalf("violations %v, want none", r.Violations)
			}
		})
	}
}

// The violation counts the runs that started beside a committed one and
// names the first.
func TestCheck_OneRunAtATime_Detail(t *testing.T) {
	in := good()
	in.Effects[0].ID = 1
	in.Runs = []history.Run{run(2, true, 408, 410, 3), run(1, true, 406, 409, 1), run(0, true, 407, 412, 2)}
	r := check.Check(in, check.Options{})
	if len(r.Violations) != 1 || r.Violations[0].Op != "k#1" {
		t.Fatalf("violations %v, want one of k#1", r.Violations)
	}
	if d := r.Violations[0].Detail; !strings.HasPrefix(d, "2 runs") || !strings.Contains(d, "client 0's started at 407ms while client 1's ran, from 406ms to 409ms") {
		t.Fatalf("detail %q", d)
	}
}
