package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// Issue 43: a retry of a finished operation is answered Replayed, every
// one, never InProgress, also when Redis has no copy of its result.

const (
	// finishedRetries is the size of one burst of retries.
	finishedRetries = 50
	// finishedBurstP99 is the target: a burst's p99 at most this many
	// times a single replay's p99 from PostgreSQL.
	finishedBurstP99 = 2.0
	// largeBodySize is above lua.Options.MaxCachedBody's default (64 KiB):
	// Redis never caches the result.
	largeBodySize = 96 << 10
)

// largeResult is a finished result too large for Redis: a 96 KiB JSON body
// of base64 text from a fixed seed, which TOAST barely compresses (a
// repeated byte would shrink to almost nothing on disk).
var largeResult = func() durable.Result {
	raw := make([]byte, largeBodySize*3/4)
	r := rand.New(rand.NewPCG(43, 1))
	for i := range raw {
		raw[i] = byte(r.Uint32())
	}
	prefix, suffix := `{"id":"ord_1","data":"`, `"}`
	body := []byte(prefix + base64.StdEncoding.EncodeToString(raw))
	body = append(body[:largeBodySize-len(suffix)], suffix...)
	return durable.Result{StatusCode: 201, Headers: result.Headers, Body: body, Version: 1}
}()

// errFnRan fails a retry of a finished operation whose fn ran.
var errFnRan = errors.New("bench: fn ran for a retry of a finished operation")

// finishedCase is one finished operation retried in bursts: its key, its
// stored result, and what its bursts were answered.
type finishedCase struct {
	name string
	key  string
	res  durable.Result
	// lost deletes the record's Redis key before each burst.
	lost bool

	burst, floor, single *variant

	bursts     int   // timed bursts
	fewest     int64 // fewest replays in a timed burst
	inProgress int   // timed bursts with an InProgress answer
	fnRuns     atomic.Int64
	maxStmts   int64 // most statements one timed burst sent
}

// retry is one retry of the finished operation: Do on the Redis Claimer.
// Replayed (the stored body, byte for byte) or InProgress are answers,
// counted; fn running, or any other answer, fails the request.
func (fc *finishedCase) retry(e *env) func(ctx context.Context) (outcome, error) {
	return func(ctx context.Context) (outcome, error) {
		out, err := e.withRedis.Do(ctx, request(fc.key), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
			fc.fnRuns.Add(1)
			return durable.Result{}, errFnRan
		})
		switch {
		case err != nil:
			return oOther, err
		case out.Kind == claim.InProgress:
			return oInProgress, nil
		case out.Kind != claim.Replayed:
			return oOther, fmt.Errorf("%w: a retry of a finished operation answered %v", ErrUnexpected, out.Kind)
		case out.Result == nil || !bytes.Equal(out.Result.Body, fc.res.Body):
			return oOther, fmt.Errorf("%w: a replay's body differs from the stored %d bytes", ErrUnexpected, len(fc.res.Body))
		case out.FromCache:
			return oReplayRedis, nil
		}
		return oReplayDB, nil
	}
}

// singleClaim is the library's single replay from PostgreSQL: Claim on the
// Claimer without Redis.
func (fc *finishedCase) singleClaim(e *env) func(ctx context.Context) (outcome, error) {
	return func(ctx context.Context) (outcome, error) {
		out, err := e.noRedis.Claim(ctx, request(fc.key))
		switch {
		case err != nil:
			return oOther, err
		case out.Kind != claim.Replayed || out.Result == nil || len(out.Result.Body) != len(fc.res.Body):
			return oOther, fmt.Errorf("%w: a single replay of a finished operation answered %v", ErrUnexpected, out.Kind)
		}
		return oReplayDB, nil
	}
}

// finishedBurstWorkload: bursts of retries of a finished operation that
// Redis cannot answer (a result too large to cache; a result whose Redis
// key was lost), against a single replay from PostgreSQL.
func finishedBurstWorkload(e *env, f *floors) *workload {
	cases := []*finishedCase{
		{name: "large", key: "finished-large", res: largeResult},
		{name: "lost", key: "finished-lost", res: result, lost: true},
	}
	w := &workload{
		name: "finished-burst",
		about: fmt.Sprintf("bursts of %d concurrent retries (Do, same key and fingerprint, on the Redis Claimer) of a finished operation: "+
			"large, whose %d KiB result is too large for Redis (default limit 64 KiB); lost, a small result whose Redis key is deleted before "+
			"each burst; latency from the burst's release. Floors, %d at a time one after the other: a bare SELECT of the record "+
			"(floor-select, as the replay workload's), and the library's single replay from PostgreSQL (Claim on the Claimer without Redis)",
			finishedRetries, largeBodySize>>10, finishedRetries),
	}
	var sides []side
	for _, fc := range cases {
		fc.burst = &variant{name: fc.name + "-burst"}
		fc.floor = &variant{name: fc.name + "-floor-select", floor: true}
		fc.single = &variant{name: fc.name + "-claim-no-redis"}
		w.variants = append(w.variants, fc.burst, fc.floor, fc.single)
		fc.fewest = finishedRetries
		retry := fc.retry(e)
		burst := side{v: fc.burst,
			run: func(ctx context.Context, t *tally, timed bool) error {
				s0 := e.counts().sql
				together(ctx, finishedRetries, t, retry)
				if timed {
					fc.bursts++
					fc.fewest = min(fc.fewest, t.replayed())
					if t.outcomes[oInProgress] > 0 {
						fc.inProgress++
					}
					fc.maxStmts = max(fc.maxStmts, e.counts().sql-s0)
				}
				return nil
			}}
		if fc.lost {
			burst.before = func(ctx context.Context) error {
				return e.rdb.Del(ctx, fastpath.KeysFor(e.prefix, scope(fc.key).Ref(nil)).Record).Err()
			}
		}
		single := fc.singleClaim(e)
		sides = append(sides, burst,
			side{v: fc.floor, run: func(ctx context.Context, t *tally, _ bool) error {
				oneAtATime(ctx, finishedRetries, t, func(ctx context.Context) (outcome, error) { return f.selectRow(ctx, fc.key) })
				return nil
			}},
			side{v: fc.single, run: func(ctx context.Context, t *tally, _ bool) error {
				oneAtATime(ctx, finishedRetries, t, single)
				return nil
			}})
	}
	// prepare finishes each operation once, through Do on the setup
	// Claimer.
	w.prepare = func(ctx context.Context) error {
		for _, fc := range cases {
			out, err := e.setup.Do(ctx, request(fc.key), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
				return fc.res, nil
			})
			if err != nil {
				return fmt.Errorf("bench: finished-burst: %s: %w", fc.name, err)
			}
			if out.Kind != claim.Executed {
				return fmt.Errorf("%w: finished-burst: finishing %s answered %v", ErrUnexpected, fc.name, out.Kind)
			}
		}
		return nil
	}
	w.measure = func(ctx context.Context) error { return alternateSides(ctx, e, sides) }
	w.finish = func(context.Context) ([]extra, error) {
		var out []extra
		for _, fc := range cases {
			out = append(out, fc.extras()...)
		}
		return out, nil
	}
	return w
}

// extras are the case's checks and its target.
func (fc *finishedCase) extras() []extra {
	b, fl, sg := &fc.burst.st, &fc.floor.st, &fc.single.st
	bp50, bp99 := b.h.quantile(0.5), b.h.quantile(0.99)
	fp50, fp99 := fl.h.quantile(0.5), fl.h.quantile(0.99)
	sp50, sp99 := sg.h.quantile(0.5), sg.h.quantile(0.99)
	vsFloor, vsSingle := ratio(bp99, fp99), ratio(bp99, sp99)
	per := func(n int64) float64 { return float64(n) / float64(max(b.rounds, 1)) }
	what := "its result is too large for Redis"
	if fc.lost {
		what = "its Redis key deleted before each burst"
	}
	replays := extra{
		Name: fmt.Sprintf("%s: fewest replayed of %d in a burst", fc.name, finishedRetries), Value: float64(fc.fewest),
		Target: fmt.Sprintf("== %d", finishedRetries), Check: true,
		Failed: fc.bursts == 0 || fc.fewest != finishedRetries || fc.inProgress > 0 || fc.fnRuns.Load() > 0,
		Note: fmt.Sprintf("a finished operation, %s: %d bursts, %d replayed from Redis, %d from the database, "+
			"%d answered in progress (in %d bursts), %d failed; fn ran %d times",
			what, fc.bursts, b.outcomes[oReplayRedis], b.outcomes[oReplayDB], b.outcomes[oInProgress], fc.inProgress, b.errs, fc.fnRuns.Load()),
	}
	p99 := extra{
		Name:   fmt.Sprintf("%s: burst p99 / single replay p99 (floor-select)", fc.name),
		Value:  vsFloor,
		Target: fmt.Sprintf("<= %g", finishedBurstP99), Meets: boolp(fc.bursts > 0 && vsFloor <= finishedBurstP99),
		Note: fmt.Sprintf("burst p50 %s p99 %s (%d retries); floor-select, a bare SELECT of the record one at a time, p50 %s p99 %s; "+
			"the library's single replay from PostgreSQL (Claim, Redis not asked) p50 %s p99 %s, the burst's p99 %.2f× it; "+
			"per burst %.1f statements (at most %d) and %.1f Redis calls, %.0fms long",
			fmtDur(bp50), fmtDur(bp99), b.ops, fmtDur(fp50), fmtDur(fp99), fmtDur(sp50), fmtDur(sp99), vsSingle,
			per(b.counts.sql), fc.maxStmts, per(b.counts.redis), float64(b.elapsed.Milliseconds())/float64(max(b.rounds, 1))),
	}
	if p99.Meets != nil && !*p99.Meets {
		p99.Bound = fc.bound(vsFloor)
	}
	return []extra{replays, p99}
}

// bound says what bounds a missed p99 target, from this run: the
// library's single replay from PostgreSQL against the floor, and the burst
// against that single replay (what the concurrency adds).
func (fc *finishedCase) bound(vsFloor float64) string {
	b, fl, sg := &fc.burst.st, &fc.floor.st, &fc.single.st
	if b.ops == 0 || fl.ops == 0 || sg.ops == 0 {
		return "not measured"
	}
	bp99, fp99, sp99 := b.h.quantile(0.99), fl.h.quantile(0.99), sg.h.quantile(0.99)
	cpu := func(s *stats) float64 { return us(s.cpu) / float64(max(s.ops, 1)) }
	single := fmt.Sprintf("the library's single replay from PostgreSQL alone is %.2f× the floor's p99, within the target", ratio(sp99, fp99))
	if ratio(sp99, fp99) > finishedBurstP99 {
		single = fmt.Sprintf("the library's single replay from PostgreSQL alone is %.2f× the floor's p99, over the target", ratio(sp99, fp99))
	}
	return fmt.Sprintf("the burst's p99 is %.2f× floor-select's: %s; the burst adds %.2f× on top of it "+
		"(p50 %s against a single replay's %s; per retry %.2f statements and %.2f Redis calls against %.2f and %.2f, "+
		"this process's CPU %.0fµs against %.0fµs; %d retries in flight at once on %d cores)",
		vsFloor, single, ratio(bp99, sp99), fmtDur(b.h.quantile(0.5)), fmtDur(sg.h.quantile(0.5)),
		perOp(b.counts.sql, b), perOp(b.counts.redis, b), perOp(sg.counts.sql, sg), perOp(sg.counts.redis, sg),
		cpu(b), cpu(sg), finishedRetries, runtime.NumCPU())
}
