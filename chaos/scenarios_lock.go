package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// do-duplicates (issue 44): duplicates of a Do reach PostgreSQL while the
// first request's function still runs in its transaction. Do locks first
// by default (the key's lock and a check that no record exists, in the
// BEGIN's round trip), so each duplicate waits for that COMMIT, finds the
// record and replays: the function never runs twice at once (the checker's
// one-fn-run-at-a-time), and never for a duplicate that met the lock.
//
// Every operation runs with Do, every client at once, and each run of its
// function holds its transaction for a fifth of the lease before writing
// its effect: the window the duplicates meet. They reach the database
// together in one of two ways, drawn per operation (the first two fixed,
// so that a short run has both):
//
//   - Redis down: the operation's clients are Claimers whose every
//     connection to Redis fails at once (their breakers open), so every
//     claim goes to the database alone;
//   - Redis lost the key: the clients use the user's Redis, which gives
//     the key to one of them; inside that one's transaction the scenario
//     deletes the key, so the next duplicate Redis sees is granted a fresh
//     lease and goes on to the database while the first holds the key's
//     lock.
//
// A duplicate that was sent before the first's function returned, did not
// run it, and replayed its result waited at the lock: counted as
// duplicate-waited-at-the-lock, which must happen (else the scenario
// forced nothing).
//
// As everywhere in the suite, every other client has WithWriteAtCommit
// (the opt-in runs the function first, without the lock, for duplicates
// too; the checker does not judge its runs). Its negative control,
// do-skips-lock, passes Do's write at commit on without the lock (every
// client on Do's default path then): the duplicates run the function
// beside the first, their inserts at commit fail and roll them back, and
// only the two runs at once show.
func setupDoDuplicates(ctx context.Context, e *env) (*workload, error) {
	st, err := e.store(storeOpts{})
	if err != nil {
		return nil, err
	}
	w, err := e.standard(ctx, st, e.userRedis, claimerOpts{})
	if err != nil {
		return nil, err
	}
	// Redis down: every connection to it fails the moment it is used (and
	// go-redis does not retry), so each duplicate's Redis call fails at
	// once and the breakers open after their first failures, the same for
	// every client. (An address where nothing listens would do it too, but
	// go-redis retries a refused dial for 400ms and logs each.)
	brk := &breakers{states: map[int][]string{}}
	down, err := e.standard(ctx, st, func(int) redis.Scripter {
		return e.redisUser("", func(o *redis.Options) {
			o.MaxRetries = -1
			o.Dialer = func(context.Context, string, string) (net.Conn, error) {
				c, peer := net.Pipe()
				peer.Close()
				return c, nil
			}
		})
	}, claimerOpts{logFor: func(c int) *slog.Logger {
		var inner slog.Handler
		if e.log != nil {
			inner = e.log.Handler()
		}
		return slog.New(&breakerHandler{b: brk, client: e.cfg.Clients + c, inner: inner})
	}})
	if err != nil {
		return nil, err
	}
	// Clients 0 .. Clients-1 reach Redis, Clients .. 2*Clients-1 do not.
	w.claimers = append(w.claimers, down.claimers...)
	admin := e.redisUser("", nil)
	hold := max(e.cfg.Lease/5, 20*time.Millisecond)
	e.expectFaults("redis-down-duplicates", "redis-key-deleted-in-transaction", "function-held-transaction", "redis-breaker-opened",
		"duplicate-waited-at-the-lock")
	w.inTx = func(ctx context.Context, a *attempt) error {
		if a.o.take("delete") {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			n, _ := admin.Del(dctx, fastpath.KeysFor(e.prefix, a.o.ref).Record).Result()
			cancel()
			if n > 0 {
				e.fault("redis-key-deleted-in-transaction")
			}
		}
		if a.o.take("hold") {
			e.fault("function-held-transaction")
		}
		// Every run holds as long: under the negative control the run
		// that started first commits first, with the others' starts
		// inside it.
		sleep(ctx, hold)
		return nil
	}
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		// The first operations' duplicates must not reach the database
		// spread out by the pool opening its connections.
		if err := warmPool(ctx, e.pool, e.cfg.Parallel*e.cfg.Clients); err != nil {
			return err
		}
		return e.eachOp(ctx, ops, func(o *op) {
			o.plan("hold", true)
			isDown := o.i == 0 // the first with Redis down, the second with the key lost
			if o.i > 1 {
				isDown = e.sched.chance(0.5, "redis-down", o.i)
			}
			first := 0
			if o.plan("redis-down", isDown) {
				first = e.cfg.Clients
				e.fault("redis-down-duplicates")
			} else {
				o.plan("delete", true)
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			for c := range e.cfg.Clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					e.client(ctx, w, o, first+c, maxAttempts)
				}()
			}
			close(start)
			wg.Wait()
		})
	}
	w.after = func(context.Context, *env, []*op) error {
		opened, _ := brk.verdict()
		e.faultN("redis-breaker-opened", int64(opened))
		e.faultN("duplicate-waited-at-the-lock", int64(e.waitedAtLock(w)))
		return nil
	}
	return w, nil
}

// waitedAtLock counts the calls of Claimers on Do's locked path that were
// sent before the function of their operation's executing call returned,
// did not run the function, and were answered with its result: a
// duplicate that reached the database while the first held the key's
// lock, waited for its COMMIT and replayed (nothing else could answer it:
// the result did not exist yet when it was sent).
func (e *env) waitedAtLock(w *workload) int {
	calls, runs := e.rec.Calls(), e.rec.Runs()
	last := map[int]history.Run{} // per call: its last run of the function
	for _, r := range runs {
		if l, ok := last[r.Call]; !ok || r.Start > l.Start {
			last[r.Call] = r
		}
	}
	held := map[string]time.Duration{} // per operation: when the executing call's function returned
	for _, c := range calls {
		if r, ok := last[c.ID]; ok && c.Kind == history.Execute && !c.Ambiguous {
			held[c.Op()] = r.End
		}
	}
	n := 0
	for _, c := range calls {
		_, ran := last[c.ID]
		if end, ok := held[c.Op()]; ok && !ran && c.Kind == history.Replay && c.Start < end && c.Client < len(w.claimers) && e.locked(w.claimer(c.Client)) {
			n++
		}
	}
	return n
}

// warmPool opens n connections of pool at once (all of them, when it
// allows fewer) and puts them back.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	n = min(n, int(pool.Config().MaxConns))
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conns := make([]*pgxpool.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { conns[i], errs[i] = pool.Acquire(ctx) })
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: open the pool's connections: %w", ErrSetup, err)
	}
	return nil
}
