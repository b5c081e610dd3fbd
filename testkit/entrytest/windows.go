package entrytest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
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

const (
	// burstSize is how many retries of a finished operation a burst sends
	// at once.
	burstSize = 12
	// bursts is how many bursts a finished-burst window sends.
	bursts = 3
	// uncachedBody is the body of the too-large window: over the largest
	// body Redis caches (lua.Options.MaxCachedBody's default, which the
	// suite's Claimer keeps).
	uncachedBody = fastpath.DefaultMaxCachedBody + 32<<10
)

// finishOnce runs key to its end with the first request (and, for an
// asynchronous adapter, its retries until the result comes back), and
// returns the result every retry must replay.
func (w *world) finishOnce(k string, p payload) (Result, bool) {
	as := w.settle(k, p, w.holdBound())
	w.waitReturned(k, 10*time.Second)
	r, ok := w.once(k)
	if !ok || !w.completed(k, r) {
		return Result{}, false
	}
	want := w.expected(r)
	w.answersMatch(k, as, want)
	if last := as[len(as)-1]; last.Outcome != Executed && last.Outcome != Replayed {
		w.violate(k, "the first request and its retries ended %s (%s), want its result", last.Outcome, last.Detail)
		return Result{}, false
	}
	return want, true
}

// burst sends burstSize retries of the finished operation of key at once
// (payload p, the one it finished with) and checks that each is answered
// as a replay of want: a finished operation is never in progress, whatever
// Redis holds of it (issue 43). n numbers the burst in the violations.
func (w *world) burst(k string, p payload, n int, want Result) {
	as := make([]Answer, burstSize)
	took := make([]time.Duration, burstSize)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range as {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			as[i] = w.a.Send(ctx, k, p.bytes())
			took[i] = time.Since(t0)
		})
	}
	close(start)
	wg.Wait()
	w.t.Logf("%s: burst %d (slowest answer %v):%s", k, n, slices.Max(took).Round(time.Millisecond), tally(as))
	var busy, other, wrong []Answer
	for _, a := range as {
		switch {
		case a.Outcome == InProgress || a.Outcome == Accepted:
			// Accepted: an asynchronous adapter's "queued or running".
			busy = append(busy, a)
		case a.Outcome != Replayed:
			other = append(other, a)
		case !a.Result.equal(want):
			wrong = append(wrong, a)
		}
	}
	if len(busy) > 0 {
		w.violate(k, "burst %d: %d of %d retries of the finished operation were answered in progress (%s, %s), want replayed",
			n, len(busy), len(as), busy[0].Outcome, busy[0].Detail)
	}
	if len(other) > 0 {
		w.violate(k, "burst %d: %d of %d retries of the finished operation were answered %s (%s), want replayed",
			n, len(other), len(as), other[0].Outcome, other[0].Detail)
	}
	if len(wrong) > 0 {
		w.violate(k, "burst %d: %d of %d replays carry %s, want %s", n, len(wrong), len(as), short(wrong[0].Result), short(want))
	}
}

// tally is a burst's answers for a log line: each distinct answer and how
// many got it, in the order they first appear.
func tally(as []Answer) string {
	type answer struct{ o, detail string }
	var order []answer
	counts := map[answer]int{}
	for _, a := range as {
		k := answer{a.Outcome.String(), a.Detail}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	var b strings.Builder
	for _, k := range order {
		fmt.Fprintf(&b, " %s (%s) x%d", k.o, k.detail, counts[k])
	}
	return b.String()
}

// notCached checks that Redis holds no copy of the result of key (the
// too-large window forces what it claims to), and reports whether it
// holds none.
func (w *world) notCached(k string, when string) bool {
	st, ok := w.redisCopy(k)
	if ok && st.Kind == fastpath.StoredResult {
		w.violate(k, "%s, Redis caches the result (%d bytes encoded): the window forced nothing, its body must be larger than Redis caches", when, len(st.Blob))
		return false
	}
	return true
}

// A result too large for Redis to cache (over 64 KiB, or the adapter's
// own limit when it is smaller; the window checks that Redis holds no copy
// of it), then bursts of concurrent retries: every retry replays it from
// the store, none is told the operation is in progress, nothing runs
// again. Every burst, not only the first: a result Redis does not cache
// meets the same Redis each time.
func finishedBurstTooLarge(w *world) {
	size := uncachedBody
	if w.caps.MaxResult > 0 && w.caps.MaxResult < size+1024 {
		// The largest body the adapter keeps whole, less a margin for the
		// handler's padding.
		size = w.caps.MaxResult - 1024
	}
	k := newKey()
	p := payload{Key: k, Do: "ok", Size: size}
	want, ok := w.finishOnce(k, p)
	if !ok {
		return
	}
	uncached := w.notCached(k, "after the completion")
	for n := 1; n <= bursts; n++ {
		w.burst(k, p, n, want)
		if uncached {
			uncached = w.notCached(k, fmt.Sprintf("after burst %d", n))
		}
	}
	w.once(k)
	w.settled(k, durable.Completed)
}

// A small result, then Redis loses every key of the window before each
// burst of concurrent retries: every retry replays from the store, none
// is told the operation is in progress, nothing runs again.
func finishedBurstRedisLost(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok"}
	want, ok := w.finishOnce(k, p)
	if !ok {
		return
	}
	w.flushRedis()
	for n := 1; n <= bursts; n++ {
		if n > 1 {
			// A replay from the store may have cached the result again.
			w.deleteRedisKeys()
		}
		w.burst(k, p, n, want)
	}
	w.once(k)
	w.settled(k, durable.Completed)
}

// A small result, then Redis becomes unreachable for the adapter's
// Claimer (connections closed, dials refused): bursts of concurrent
// retries meet failing Redis calls, then the open breaker, and every one
// replays from the store. Once Redis is back, a last burst replays too.
func finishedBurstRedisDown(w *world) {
	k := newKey()
	p := payload{Key: k, Do: "ok"}
	want, ok := w.finishOnce(k, p)
	if !ok {
		return
	}
	w.redis.setDown(true)
	func() {
		defer w.redis.setDown(false)
		for n := 1; n <= bursts; n++ {
			w.burst(k, p, n, want)
		}
	}()
	if w.redis.refusals() == 0 {
		// The gate works (TestRedisGate): the adapter's retries did not
		// ask Redis (claimriver claims inside a transaction, in the store
		// alone). They were checked all the same.
		w.t.Logf("%s: the adapter's Claimer never dialed Redis while it was down: its retries do not ask Redis", k)
	}
	w.burst(k, p, bursts+1, want)
	w.once(k)
	w.settled(k, durable.Completed)
}
