package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// The wake-up of waiting duplicates (issue 43, part 2): a holder has the
// key, duplicates wait on it (claim.WithWait), the holder commits. How long
// after the holder's commit returned is each duplicate answered?
const (
	wakeWaiters = 20
	wakeWait    = 2 * time.Second // the waiters' claim.WithWait
	// The holder holds the key for a time drawn uniformly from
	// [wakeHoldMin, wakeHoldMax) after the waiters were released, so a
	// waiter that re-asks on a schedule meets the commit at any point of it.
	wakeHoldMin = 20 * time.Millisecond
	wakeHoldMax = 200 * time.Millisecond
	// The targets with Redis up.
	wakeP50 = 5 * time.Millisecond
	wakeP99 = 50 * time.Millisecond
)

// wakeClaimers are the workload's Claimers: the holder's and the
// waiters' (claim.WithWait), on the run's Redis and on a dead one (a
// refused port, the breaker open).
type wakeClaimers struct {
	holder, waiter         *claim.Claimer[pgx.Tx]
	downHolder, downWaiter *claim.Claimer[pgx.Tx]
}

// wakeSide is one variant of the wake workload and what its timed trials
// came to.
type wakeSide struct {
	v     *variant
	redis bool // Redis up, else down (breaker open)
	do    bool // the holder and the waiters through Do (the holder's fn blocks), else Claim and a Lease
	floor bool // no waiting: the duplicates are sent the instant the holder's commit returned
	// pick returns the holder's Claimer and the duplicates'.
	pick func() (holder, waiter *claim.Claimer[pgx.Tx])

	trials  int
	fewest  int64           // fewest replays of the duplicates in a trial
	early   int64           // answers seen before the holder's commit returned (booked as 0)
	spreads []time.Duration // per trial, first to last duplicate's answer
	// afterCommit is, per trial, how long after its commit returned the
	// holder's call (Lease.Complete, Do) did.
	afterCommit []time.Duration
	unseen      int // trials whose commit the tracer did not see: timed from the holder's call returning
	fnRuns      atomic.Int64
}

var wakeSeq atomic.Int64

// holding is a key the holder has: commit completes it and returns when
// the holder's call (Lease.Complete, or Do) has returned.
type holding struct{ commit func() error }

// hold takes key on c: Claim (Acquired) or Do, whose fn blocks until
// commit.
func (ws *wakeSide) hold(ctx context.Context, c *claim.Claimer[pgx.Tx], key string) (holding, error) {
	if !ws.do {
		out, err := c.Claim(ctx, request(key))
		if err != nil {
			return holding{}, fmt.Errorf("holder: %w", err)
		}
		if out.Kind != claim.Acquired {
			return holding{}, fmt.Errorf("%w: the holder's Claim of a fresh key answered %v", ErrUnexpected, out.Kind)
		}
		return holding{commit: func() error { return out.Lease.Complete(ctx, result) }}, nil
	}
	inFn, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		out, err := c.Do(ctx, request(key), func(ctx context.Context, _ pgx.Tx, _ claim.Op) (durable.Result, error) {
			close(inFn)
			select {
			case <-release:
				return result, nil
			case <-ctx.Done():
				return durable.Result{}, ctx.Err()
			}
		})
		if err == nil && out.Kind != claim.Executed {
			err = fmt.Errorf("%w: the holder's Do of a fresh key answered %v", ErrUnexpected, out.Kind)
		}
		done <- err
	}()
	select {
	case <-inFn:
	case err := <-done:
		return holding{}, fmt.Errorf("holder: %w", err)
	}
	return holding{commit: func() error {
		close(release)
		if err := <-done; err != nil {
			return fmt.Errorf("holder: %w", err)
		}
		return nil
	}}, nil
}

// ask is one duplicate of the held key on c: Claim, or Do (whose fn must
// not run). Replayed (the holder's result) and InProgress are answers;
// anything else fails the request.
func (ws *wakeSide) ask(ctx context.Context, c *claim.Claimer[pgx.Tx], key string) (outcome, error) {
	var (
		out claim.Outcome
		err error
	)
	if ws.do {
		out, err = c.Do(ctx, request(key), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
			ws.fnRuns.Add(1)
			return durable.Result{}, errFnRan
		})
	} else {
		out, err = c.Claim(ctx, request(key))
	}
	switch {
	case err != nil:
		return oOther, err
	case out.Kind == claim.InProgress:
		return oInProgress, nil
	case out.Kind == claim.Acquired:
		_ = out.Lease.Release(context.WithoutCancel(ctx))
		return oOther, fmt.Errorf("%w: a duplicate acquired a held key", ErrUnexpected)
	case out.Kind != claim.Replayed:
		return oOther, fmt.Errorf("%w: a duplicate answered %v", ErrUnexpected, out.Kind)
	case out.Result == nil || !bytes.Equal(out.Result.Body, result.Body):
		return oOther, fmt.Errorf("%w: a duplicate replayed another body", ErrUnexpected)
	case out.FromCache:
		return oReplayRedis, nil
	}
	return oReplayDB, nil
}

// trial runs one holder and its duplicates on a fresh key. Waiting
// variants release the duplicates, let the holder hold, then commit; the
// floor commits first and releases the duplicates the instant the holder's
// call returned. Each answer's latency runs from when the commit returned.
func (ws *wakeSide) trial(ctx context.Context, e *env, t *tally, timed bool) error {
	holder, waiter := ws.pick()
	key := ws.v.name + "-" + strconv.FormatInt(wakeSeq.Add(1), 10)
	ctx, cancel := context.WithTimeout(ctx, wakeWait+10*time.Second) // a stuck trial must not hang the run
	defer cancel()
	h, err := ws.hold(ctx, holder, key)
	if err != nil {
		return err
	}
	type answer struct {
		at  time.Time
		o   outcome
		err error
	}
	var (
		answers = make([]answer, wakeWaiters)
		start   = make(chan struct{})
		wg      sync.WaitGroup
	)
	for i := range answers {
		wg.Go(func() {
			<-start
			o, err := ws.ask(ctx, waiter, key)
			answers[i] = answer{time.Now(), o, err}
		})
	}
	// The latencies run from when the holder's commit returned, seen by
	// the tracer; the holder's call returns later, after the library's
	// Redis step (the cached result and the wake; with Redis down, now and
	// then a probe of the dead port).
	stop := e.sql.watchCommit()
	if ws.floor {
		err = h.commit()
		close(start)
	} else {
		close(start)
		time.Sleep(wakeHoldMin + rand.N(wakeHoldMax-wakeHoldMin))
		err = h.commit()
	}
	returned := time.Now()
	committed := stop()
	if committed.IsZero() {
		if timed && err == nil {
			ws.unseen++
		}
		committed = returned
	}
	wg.Wait()
	if err != nil {
		return err
	}
	var (
		first, last time.Time
		replayed    int64
	)
	for _, a := range answers {
		lat := a.at.Sub(committed)
		if lat < 0 {
			if timed {
				ws.early++
			}
			lat = 0
		}
		t.add(lat, a.o, a.err)
		if a.err != nil {
			continue
		}
		if a.o == oReplayRedis || a.o == oReplayDB {
			replayed++
		}
		if first.IsZero() || a.at.Before(first) {
			first = a.at
		}
		if a.at.After(last) {
			last = a.at
		}
	}
	if timed {
		ws.trials++
		ws.fewest = min(ws.fewest, replayed)
		ws.spreads = append(ws.spreads, last.Sub(first))
		ws.afterCommit = append(ws.afterCommit, returned.Sub(committed))
	}
	return nil
}

// wakeWorkload: a holder, wakeWaiters duplicates waiting on it
// (claim.WithWait), the holder's commit; the time from the commit to each
// duplicate's answer, with Redis up and down, against the duplicates sent
// at the instant of the commit.
func wakeWorkload(e *env) *workload {
	var cs wakeClaimers
	up := func() (*claim.Claimer[pgx.Tx], *claim.Claimer[pgx.Tx]) { return cs.holder, cs.waiter }
	oneClaimer := func() (*claim.Claimer[pgx.Tx], *claim.Claimer[pgx.Tx]) { return cs.waiter, cs.waiter }
	down := func() (*claim.Claimer[pgx.Tx], *claim.Claimer[pgx.Tx]) { return cs.downHolder, cs.downWaiter }
	sides := []*wakeSide{
		{v: &variant{name: "claim-redis"}, redis: true, pick: up},
		{v: &variant{name: "claim-redis-one-claimer"}, redis: true, pick: oneClaimer},
		{v: &variant{name: "do-redis"}, redis: true, do: true, pick: up},
		{v: &variant{name: "floor-redis", floor: true}, redis: true, floor: true, pick: up},
		{v: &variant{name: "claim-redis-down"}, pick: down},
		{v: &variant{name: "do-redis-down"}, do: true, pick: down},
		{v: &variant{name: "floor-redis-down", floor: true}, floor: true, pick: down},
	}
	w := &workload{
		name: "wake",
		about: fmt.Sprintf("a holder takes a fresh key (Claim, a Lease; do-*: Do, its fn blocked), %d duplicates wait on it "+
			"(Claim, do-*: Do, on a Claimer with WithWait(%s)), the holder commits after %s-%s (Lease.Complete; do-*: fn returns); "+
			"latency: from the holder's commit returning (the end of its COMMIT, seen by the pgx tracer) to each duplicate's answer "+
			"(one before it counts 0). "+
			"The holder runs on a Claimer of its own (another instance), but in claim-redis-one-claimer on the duplicates'. "+
			"Floors: the same holder, then the %d duplicates (Claim) sent the instant its call returned, timed from its commit too. "+
			"*-redis-down: both Claimers on a refused port, their breakers open",
			wakeWaiters, wakeWait, wakeHoldMin, wakeHoldMax, wakeWaiters),
	}
	var run []side
	for _, ws := range sides {
		ws.fewest = wakeWaiters
		w.variants = append(w.variants, ws.v)
		run = append(run, side{v: ws.v, run: func(ctx context.Context, t *tally, timed bool) error {
			return ws.trial(ctx, e, t, timed)
		}})
	}
	w.prepare = func(ctx context.Context) (err error) {
		if cs.holder, err = e.claimer(e.rdb, nil); err != nil {
			return err
		}
		if cs.waiter, err = e.claimer(e.rdb, nil, claim.WithWait(wakeWait)); err != nil {
			return err
		}
		dead, err := newDeadRedis(false, e.cfg.redisTimeout, wakeWaiters+8, e.rc)
		if err != nil {
			return err
		}
		e.closers = append(e.closers, dead.close)
		open := func(more ...claim.Option) (*claim.Claimer[pgx.Tx], error) {
			var opened atomic.Bool
			c, err := e.claimer(dead.client, func(s fastpath.BreakerState) {
				if s == fastpath.BreakerOpen {
					opened.Store(true)
				}
			}, more...)
			if err != nil {
				return nil, err
			}
			for i := 0; !opened.Load(); i++ {
				if i == 50 {
					return nil, fmt.Errorf("bench: wake: the breaker of a Claimer on a refused Redis did not open")
				}
				if _, err := doFresh(ctx, c, randName("wake-open-")); err != nil {
					return nil, fmt.Errorf("bench: wake: opening the breaker: %w", err)
				}
			}
			return c, nil
		}
		if cs.downHolder, err = open(); err != nil {
			return err
		}
		cs.downWaiter, err = open(claim.WithWait(wakeWait))
		return err
	}
	w.measure = func(ctx context.Context) error { return alternateSides(ctx, e, run) }
	w.finish = func(context.Context) ([]extra, error) {
		floors := map[bool]*wakeSide{true: sides[3], false: sides[6]}
		var out []extra
		for _, ws := range sides {
			out = append(out, ws.extras(floors[ws.redis])...)
		}
		return out, nil
	}
	return w
}

// extras are the side's checks, figures and (Redis up) targets.
func (ws *wakeSide) extras(floor *wakeSide) []extra {
	s, fs := &ws.v.st, &floor.v.st
	p50, p99 := s.h.quantile(0.5), s.h.quantile(0.99)
	fp50, fp99 := fs.h.quantile(0.5), fs.h.quantile(0.99)
	name := ws.v.name
	out := []extra{{
		Name: fmt.Sprintf("%s: fewest replayed of %d in a trial", name, wakeWaiters), Value: float64(ws.fewest),
		Target: fmt.Sprintf("== %d", wakeWaiters), Check: true,
		Failed: ws.trials == 0 || ws.fewest != wakeWaiters || ws.fnRuns.Load() > 0,
		Note: fmt.Sprintf("%d trials: %d replayed from Redis, %d from the database, %d in progress, %d failed; fn ran %d times",
			ws.trials, s.outcomes[oReplayRedis], s.outcomes[oReplayDB], s.outcomes[oInProgress], s.errs, ws.fnRuns.Load()),
	}}
	if ws.floor {
		return append(out, extra{Name: name + ": p50", Value: us(p50), Unit: "µs",
			Note: fmt.Sprintf("p99 %s: %d duplicates (Claim) sent the instant the holder's call returned, timed from its commit, %d trials; "+
				"%.2f Redis calls and %.2f statements each (the holder's included)",
				fmtDur(p99), wakeWaiters, ws.trials, perOp(s.counts.redis, s), perOp(s.counts.sql, s))})
	}
	vs := fmt.Sprintf("%s the floor's p50 %s (%.2f×), p99 %s the floor's %s (%.2f×); "+
		"each duplicate made %.2f Redis calls and %.2f statements (the holder's included; the floor's %.2f and %.2f)",
		fmtDur(p50), fmtDur(fp50), ratio(p50, fp50), fmtDur(p99), fmtDur(fp99), ratio(p99, fp99),
		perOp(s.counts.redis, s), perOp(s.counts.sql, s), perOp(fs.counts.redis, fs), perOp(fs.counts.sql, fs))
	p50x := extra{Name: name + ": wake p50", Value: us(p50), Unit: "µs", Note: "p50 " + vs}
	p99x := extra{Name: name + ": wake p99", Value: us(p99), Unit: "µs",
		Note: fmt.Sprintf("%d duplicates in %d trials, held %s-%s", s.ops, ws.trials, wakeHoldMin, wakeHoldMax)}
	if ws.redis {
		p50x.Target, p50x.Meets = "<= "+fmtDur(wakeP50), boolp(ws.trials > 0 && p50 <= wakeP50)
		p99x.Target, p99x.Meets = "<= "+fmtDur(wakeP99), boolp(ws.trials > 0 && p99 <= wakeP99)
		p50x.Bound = wakeBound(p50, fp50, wakeP50, "p50", s, fs)
		p99x.Bound = wakeBound(p99, fp99, wakeP99, "p99", s, fs)
	} else {
		p50x.Note += "; Redis down: reported, no target"
	}
	median, most := medianMax(ws.spreads)
	after, afterMost := medianMax(ws.afterCommit)
	return append(out, p50x, p99x, extra{
		Name: name + ": spread, first to last duplicate's answer (median trial)", Value: us(median), Unit: "µs",
		Note: fmt.Sprintf("the widest %s over %d trials; %d answers seen before the holder's commit returned (counted 0); "+
			"the holder's call returned %s after its commit (median; at most %s)%s",
			fmtDur(most), ws.trials, ws.early, fmtDur(after), fmtDur(afterMost), ws.unseenNote()),
	})
}

// unseenNote names the trials whose commit the tracer missed.
func (ws *wakeSide) unseenNote() string {
	if ws.unseen == 0 {
		return ""
	}
	return fmt.Sprintf("; %d trials timed from the holder's call returning (their commit was not seen)", ws.unseen)
}

// medianMax returns the median and the largest of ds.
func medianMax(ds []time.Duration) (median, most time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Sorted(slices.Values(ds))
	return s[len(s)/2], s[len(s)-1]
}

// wakeBound says what bounds a missed wake target: the floor itself, or
// the wait.
func wakeBound(got, floor, target time.Duration, q string, s, fs *stats) string {
	if floor > target {
		return fmt.Sprintf("%s %s; bounded by the floor: the duplicates sent the instant the holder's call returned alone take %s", q, fmtDur(got), fmtDur(floor))
	}
	return fmt.Sprintf("%s %s, %.1f× the floor's %s, which is within it: the wait adds %s; "+
		"a duplicate made %.2f Redis calls and %.2f statements while it waited (the floor's %.2f and %.2f)",
		q, fmtDur(got), ratio(got, floor), fmtDur(floor), fmtDur(got-floor),
		perOp(s.counts.redis, s), perOp(s.counts.sql, s), perOp(fs.counts.redis, fs), perOp(fs.counts.sql, fs))
}

// perOp is n per answer of s.
func perOp(n int64, s *stats) float64 { return float64(n) / float64(max(s.ops, 1)) }
