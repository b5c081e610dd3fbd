package entrytest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/testenv"
)

func newKey() string { return testenv.Name("k") }

// expected is the result the adapter must publish and replay for run r:
// the handler's body, or none (flagged) when it is over the adapter's
// limit.
func (w *world) expected(r run) Result {
	res := Result{Failed: r.resp.Kind == Failure, Body: r.resp.Body}
	if w.caps.MaxResult > 0 && len(r.resp.Body) > w.caps.MaxResult {
		res.Body, res.Omitted = nil, true
	}
	return res
}

// once checks that key ran exactly once, and returns that run.
func (w *world) once(key string) (run, bool) {
	runs := w.runsOf(key)
	switch {
	case len(runs) == 0:
		w.violate(key, "never ran")
		return run{}, false
	case len(runs) > 1:
		w.violate(key, "ran %d times: one operation, %d effects", len(runs), len(runs))
		return run{}, false
	}
	return runs[0], true
}

// completed checks that run r finished its work: not stopped by its
// context, not panicked, answered a success.
func (w *world) completed(key string, r run) bool {
	switch {
	case r.interrupted != nil:
		w.violate(key, "the work was stopped before it ended: %v", r.interrupted)
	case !r.returned:
		w.violate(key, "the work never returned")
	case r.resp.Kind != Success:
		w.violate(key, "the work answered %v, not a success", r.resp.Kind)
	default:
		return true
	}
	return false
}

// answersMatch checks that every answer that carries a result carries
// want: the first caller and every retry get one and the same stored
// result.
func (w *world) answersMatch(key string, as []Answer, want Result) {
	for i, a := range as {
		if a.Outcome != Executed && a.Outcome != Replayed {
			continue
		}
		if !a.Result.equal(want) {
			w.violate(key, "answer %d (%s) carries %s, want %s", i+1, a.Outcome, short(a.Result), short(want))
		}
	}
}

func short(r Result) string {
	b := string(r.Body)
	if len(b) > 80 {
		b = b[:80] + fmt.Sprintf("...(%d bytes)", len(r.Body))
	}
	return fmt.Sprintf("{failed=%v omitted=%v body=%q}", r.Failed, r.Omitted, b)
}

// lastIs checks that the last answer is want.
func (w *world) lastIs(key string, as []Answer, want Outcome) bool {
	if len(as) == 0 {
		w.violate(key, "no answer")
		return false
	}
	last := as[len(as)-1]
	if last.Outcome != want {
		w.violate(key, "the last of %d answers is %s (%s), want %s", len(as), last.Outcome, last.Detail, want)
		return false
	}
	return true
}

// settled checks that the record of key is in one of the states want (or
// reaches one within a short grace: the windows call it once the retries
// got a final answer, or gave up after holdBound). A record still
// processing then is held.
func (w *world) settled(key string, want ...durable.State) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		rec, ok := w.record(key)
		if !ok {
			return // never ran: reported already
		}
		for _, s := range want {
			if rec.State == s {
				return
			}
		}
		if rec.State != durable.Processing || time.Now().After(deadline) {
			w.violate(key, "the record is %s (lease %v left), want %v: held", rec.State, rec.LeaseRemaining, want)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replaysOnce is how most windows end: the retries of key (payload p)
// get a final answer; the work ran exactly once and completed; every
// answer that carries a result, those given before (earlier) and the
// retries', carries its result; the last retry replays it; the record is
// completed.
func (w *world) replaysOnce(k string, p payload, earlier ...Answer) {
	as := w.settle(k, p, w.holdBound())
	r, ok := w.once(k)
	if !ok {
		return
	}
	w.completed(k, r)
	w.answersMatch(k, append(earlier[:len(earlier):len(earlier)], as...), w.expected(r))
	w.lastIs(k, as, Replayed)
	w.settled(k, durable.Completed)
}

// sendAsync sends in the background.
func (w *world) sendAsync(ctx context.Context, key string, p payload) <-chan Answer {
	ch := make(chan Answer, 1)
	go func() {
		a := w.a.Send(ctx, key, p.bytes())
		w.t.Logf("%s: %s %s", key, a.Outcome, a.Detail)
		ch <- a
	}()
	return ch
}

// The store goes down for 300 ms as the work ends, with a 2 s lease: the
// completion is retried until it lands; the first caller gets the result
// or an in-progress answer, never a second execution.
func outageShort(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok", CutMs: 300}
	first := w.send(k, p)
	w.waitReturned(k, 10*time.Second)
	w.replaysOnce(k, p, first)
}

// The store goes down for longer than the lease as the work ends. The
// design (docs/DESIGN.md 6.3, 13) hands such an operation to a takeover as
// after a crash, so the work may run a second time; what it promises, and
// what is checked, is exact:
//   - at most two executions (the first, and one takeover after its lease
//     ran out), both under the same operation identity (the downstream's
//     idempotency key);
//   - the record ends completed with one result: that of the last
//     execution (a takeover fences the first one's completion out);
//   - every answer that carries a result, the first caller's included,
//     carries that one result: never two completed results.
func outageLong(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok", CutMs: int((w.lease + time.Second) / time.Millisecond)}
	firstCh := w.sendAsync(context.Background(), k, p)
	if !w.waitStarted(k, 10*time.Second) {
		w.violate(k, "the work never started")
		return
	}
	w.outages.Wait()
	// The retry comes as the store is back: it may find the lease run out
	// and take the operation over, or find it completed.
	as := w.settle(k, p, w.holdBound()+w.lease)
	first := <-firstCh
	w.waitReturned(k, 10*time.Second)
	runs := w.runsOf(k)
	switch {
	case len(runs) == 0:
		w.violate(k, "never ran")
		return
	case len(runs) > 2:
		w.violate(k, "ran %d times: more than the one takeover an outage longer than the lease allows", len(runs))
		return
	}
	for _, r := range runs[1:] {
		if r.opID != runs[0].opID {
			w.violate(k, "the takeover ran under operation %s, the first under %s", r.opID, runs[0].opID)
		}
	}
	w.t.Logf("%s: %d executions", k, len(runs))
	last := runs[len(runs)-1]
	if !w.completed(k, last) {
		return
	}
	w.answersMatch(k, append([]Answer{first}, as...), w.expected(last))
	// The retry that took over answers its own execution; otherwise it
	// replays.
	if len(runs) == 1 || as[len(as)-1].Outcome != Executed {
		w.lastIs(k, as, Replayed)
	}
	w.settled(k, durable.Completed)
}

// The store is cut for 1.5 s from the start of the work, which runs 2 s,
// with a 4 s lease (this window's own): the renewal due a third of the
// lease (1.33 s) after the claim falls in the cut whenever the work starts
// within that third, and fails; the renewals retried after the cut land
// long before the lease could run out by the worker's clock (its deadline
// less the start margin, 3.6 s after the claim). The work is not stopped
// and completes once.
func renewalsFail(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok", CutMs: 1500, WorkMs: 2000}
	first := w.send(k, p)
	w.waitReturned(k, 10*time.Second)
	w.replaysOnce(k, p, first)
}

// The handler panics after its effect: the record is uncertain, retries
// are told so and never run it again, and the adapter goes on serving.
func panicAfterEffect(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "panic"}
	first := w.send(k, p)
	w.waitReturned(k, 10*time.Second)
	as := w.settle(k, p, w.holdBound())
	if _, ok := w.once(k); !ok {
		return
	}
	for i, a := range append([]Answer{first}, as...) {
		if a.Outcome == Executed || a.Outcome == Replayed {
			w.violate(k, "answer %d (%s) carries a result %s, but the handler panicked", i+1, a.Outcome, short(a.Result))
		}
	}
	w.lastIs(k, as, Uncertain)
	w.settled(k, durable.Uncertain)
	// The process survived the panic: another operation runs.
	k2 := newKey()
	p2 := payload{Key: k2, Do: "ok"}
	as2 := w.settle(k2, p2, w.holdBound())
	if r, ok := w.once(k2); ok {
		w.answersMatch(k2, as2, w.expected(r))
		if last := as2[len(as2)-1]; last.Outcome != Executed && last.Outcome != Replayed {
			w.violate(k2, "after a panic, another operation got %s (%s), want its result", last.Outcome, last.Detail)
		}
	}
}

// The caller goes away (HTTP client gone, gRPC context cancelled) while
// the work runs: the work goes on to its end, its result is stored once,
// and a retry gets it.
func callerGone(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok", WorkMs: 1200}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		if w.waitStarted(k, 10*time.Second) {
			time.Sleep(200 * time.Millisecond)
		}
		cancel()
	}()
	first := w.a.Send(ctx, k, p.bytes())
	w.t.Logf("%s: %s %s", k, first.Outcome, first.Detail)
	if first.Outcome != Error {
		// The suite's own failure: the caller was to be gone before the
		// answer.
		w.violate(k, "the caller got %s (%s): it was not gone mid-work, the window forced nothing", first.Outcome, first.Detail)
	}
	w.waitReturned(k, 10*time.Second)
	w.replaysOnce(k, p, first)
}

// A result four times the adapter's limit: stored by the adapter's rule
// (HTTP: status and headers, no body, flagged), the first caller gets
// exactly what every retry gets.
func oversized(w *world) {
	if w.caps.MaxResult <= 0 {
		w.t.Fatal("entrytest: the oversized window needs Caps.MaxResult, or must be declared not applicable")
	}
	k := newKey()
	p := payload{Key: k, Do: "ok", Size: 4 * w.caps.MaxResult}
	first := w.send(k, p)
	w.waitReturned(k, 10*time.Second)
	w.replaysOnce(k, p, first)
}

// Duplicates arrive (a retry, a redelivery) while the work runs: they are
// told it is in progress (or, for a consumer, wait and are acknowledged as
// replays), and never run it again.
func duplicate(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok", WorkMs: 1500}
	firstCh := w.sendAsync(context.Background(), k, p)
	if !w.waitStarted(k, 10*time.Second) {
		w.violate(k, "the work never started")
		return
	}
	var (
		mu   sync.Mutex
		dups []Answer
		wg   sync.WaitGroup
	)
	for range 2 {
		wg.Go(func() {
			a := w.send(k, p)
			mu.Lock()
			dups = append(dups, a)
			mu.Unlock()
		})
	}
	wg.Wait()
	first := <-firstCh
	for _, d := range dups {
		if d.Outcome == Executed {
			w.violate(k, "a duplicate during the work was executed")
		}
	}
	w.replaysOnce(k, p, append([]Answer{first}, dups...)...)
}

// The same key with another payload is refused and never runs; the
// original still replays.
func mismatch(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok"}
	as := w.settle(k, p, w.holdBound())
	other := p
	other.V = "other"
	a := w.send(k, other)
	if a.Outcome != Rejected {
		w.violate(k, "another payload under the key got %s (%s), want rejected", a.Outcome, a.Detail)
	}
	again := w.settle(k, p, w.holdBound())
	r, ok := w.once(k)
	if !ok {
		return
	}
	w.answersMatch(k, append(as, again...), w.expected(r))
	w.lastIs(k, again, Replayed)
	w.settled(k, durable.Completed)
}

// Redis loses everything between two attempts: the retry replays from
// PostgreSQL and runs nothing.
func redisEmptied(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok"}
	as := w.settle(k, p, w.holdBound())
	if last := as[len(as)-1]; last.Outcome != Executed && last.Outcome != Replayed {
		w.violate(k, "got %s (%s), want its result", last.Outcome, last.Detail)
		return
	}
	w.flushRedis()
	a := w.send(k, p)
	r, ok := w.once(k)
	if !ok {
		return
	}
	if a.Outcome != Replayed {
		w.violate(k, "after Redis was emptied the retry got %s (%s), want replayed", a.Outcome, a.Detail)
	}
	w.answersMatch(k, append(as, a), w.expected(r))
	w.settled(k, durable.Completed)
}

// Two operations end uncertain; an operator resolves one as completed and
// the other as failed, storing results in the adapter's own format
// (Driver.Encode); retries replay each exactly, in the adapter's format,
// and nothing runs again.
func resolve(w *world) {
	kOK, kFail := newKey(), newKey()
	pOK, pFail := payload{Key: kOK, Do: "uncertain"}, payload{Key: kFail, Do: "uncertain"}
	for _, c := range []struct {
		k string
		p payload
	}{{kOK, pOK}, {kFail, pFail}} {
		as := w.settle(c.k, c.p, w.holdBound())
		if _, ok := w.once(c.k); !ok {
			return
		}
		if !w.lastIs(c.k, as, Uncertain) {
			return
		}
	}
	okBody := []byte(`{"resolved":"completed","by":"operator"}`)
	failBody := []byte(`{"resolved":"failed","by":"operator"}`)
	w.resolve(map[string]resolution{
		kOK:   {durable.Completed, Response{Kind: Success, Body: okBody}},
		kFail: {durable.Failed, Response{Kind: Failure, Body: failBody}},
	})
	for _, c := range []struct {
		k    string
		p    payload
		want Result
		st   durable.State
	}{{kOK, pOK, Result{Body: okBody}, durable.Completed}, {kFail, pFail, Result{Failed: true, Body: failBody}, durable.Failed}} {
		a := w.send(c.k, c.p)
		if a.Outcome != Replayed {
			w.violate(c.k, "after the operator resolved it as %s a retry got %s (%s), want replayed", c.st, a.Outcome, a.Detail)
		}
		w.answersMatch(c.k, []Answer{a}, c.want)
		w.once(c.k)
		w.settled(c.k, c.st)
	}
}

// The work outlasts the lease and the transport's own timer (NATS
// AckWait, River's job timeout): it is neither cut nor run again, and
// completes once.
func longWork(w *world) {
	k := newKey()
	d := max(w.lease, w.caps.Timer) + time.Second
	p := payload{Key: k, Do: "ok", WorkMs: int(d / time.Millisecond)}
	first := w.send(k, p)
	w.waitReturned(k, d+10*time.Second)
	w.replaysOnce(k, p, first)
}
