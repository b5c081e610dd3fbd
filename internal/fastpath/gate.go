package fastpath

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxSends bounds the sends in flight at once on one *redis.Client: a call
// sent alone, or a pipeline of the calls that queued behind them. Redis
// runs one command at a time, so more sends in flight do not make it
// answer sooner; they cost a write and a read system call per call on
// both sides where a pipeline costs one for all. Measured with `go run
// ./bench -workload storm` (bench/README.md).
const maxSends = 4

// maxBatch bounds the calls in one pipeline.
const maxBatch = 128

// gate stands in front of a *redis.Client (see [New]): at most limit
// sends in flight, each on its own connection of the pool; a call that
// finds them all taken queues, and whichever send ends next takes the
// queue out as one pipeline. A call is never queued while a send is free,
// so a call alone pays nothing for it.
type gate struct {
	client *redis.Client
	limit  int
	// wait bounds a call's wait in the queue, as the client's PoolTimeout
	// bounds the wait for a connection.
	wait time.Duration

	mu       sync.Mutex
	inFlight int
	queue    []*queued
}

// queued is a call waiting in the gate's queue, then in a pipeline.
type queued struct {
	ctx   context.Context // the caller's
	probe bool
	name  string
	sc    *luaScript
	c     *call
	since time.Time
	// state: waiting (0), taken by a sender (1), withdrawn by its caller
	// (2). Whoever moves it from waiting owns the breaker's record of it.
	state atomic.Int32
	done  chan struct{} // closed once v and err are set
	v     any
	err   error
}

const (
	qWaiting int32 = iota
	qTaken
	qWithdrawn
)

func (q *queued) withdraw() bool { return q.state.CompareAndSwap(qWaiting, qWithdrawn) }

// enter takes a send for a call that finds one free and nobody queued.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight < g.limit && len(g.queue) == 0 {
		g.inFlight++
		return true
	}
	return false
}

// leave gives back a send after a call sent alone: to a sender of the
// queue when calls wait, or to the gate. ok says whether that call
// succeeded; after a failure the next send carries one call only.
func (s *Scripts) leave(ok bool) {
	g := s.gate
	g.mu.Lock()
	if len(g.queue) == 0 {
		g.inFlight--
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	go s.drain(ok)
}

// drain holds one send and sends the queue, a pipeline at a time, until
// it is empty. While Redis fails, a pipeline carries one call (a send
// whose last call failed probes with one call), and while the breaker is
// not closed only its probe is sent: the other calls return
// [ErrBreakerOpen] unsent, as they would have waiting for a connection.
func (s *Scripts) drain(ok bool) {
	g := s.gate
	var batch []*queued
	for {
		n := maxBatch
		if !ok {
			n = 1
		}
		closed := s.breaker.State() == BreakerClosed
		batch = batch[:0]
		g.mu.Lock()
		i := 0
		for ; i < len(g.queue) && len(batch) < n; i++ {
			q := g.queue[i]
			if !closed && !q.probe {
				continue // it withdraws itself: the breaker's trip ends its wait
			}
			if q.state.CompareAndSwap(qWaiting, qTaken) {
				batch = append(batch, q)
			}
		}
		// Drop what was taken or withdrawn; keep the rest in order.
		rest := g.queue[:0]
		for _, q := range g.queue {
			if q.state.Load() == qWaiting {
				rest = append(rest, q)
			}
		}
		clear(g.queue[len(rest):])
		g.queue = rest
		if len(batch) == 0 {
			g.inFlight--
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		ok = s.sendBatch(batch)
	}
}

// sendBatch sends the calls of batch, one pipeline with the per-call
// timeout, records each outcome with the breaker, and wakes each caller.
// It reports whether any call succeeded.
func (s *Scripts) sendBatch(batch []*queued) bool {
	// The first caller's context values (a tracing hook's span) go with
	// the pipeline; no caller's cancellation ends the others' calls.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), s.timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	for _, q := range batch {
		q.c.shorten(time.Since(q.since))
	}
	replies := make([]reply, len(batch))
	if s.direct {
		s.exec(ctx, batch, replies)
	} else {
		// The client ignores ctx's deadline: stop waiting at it, and
		// hold the send until the client gives the connection back.
		got := make([]reply, len(batch))
		sent, ok := untilDone(ctx, func() { s.exec(ctx, batch, got) })
		if ok {
			replies = got
		} else {
			for i := range replies {
				replies[i].err = ctx.Err()
			}
			defer func() { <-sent }()
		}
	}
	ok := false
	for i, q := range batch {
		r := replies[i]
		s.record(q.ctx, q.probe, deadline, r.err)
		if r.err == nil {
			ok = true
			q.v = r.v
		} else {
			q.err = fmt.Errorf("%w: %s: %w", ErrUnavailable, q.name, r.err)
		}
		close(q.done)
	}
	return ok
}

// exec sends batch as one pipeline (a lone call as itself) and puts each
// reply in replies. A call the server answers NOSCRIPT is sent again
// alone, with EVAL.
func (s *Scripts) exec(ctx context.Context, batch []*queued, replies []reply) {
	if len(batch) == 1 {
		replies[0].v, replies[0].err = s.send(ctx, batch[0].sc, batch[0].c)
		return
	}
	p := s.gate.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, q := range batch {
		cmds[i] = q.c.evalsha(ctx, q.sc)
		_ = p.Process(ctx, cmds[i])
	}
	_, _ = p.Exec(ctx) // each command carries its own error
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if noScript(err) {
			v, err = s.eval(ctx, batch[i].sc, batch[i].c)
		}
		replies[i] = reply{v, err}
	}
}

// queue puts a call that found every send taken in the gate's queue and
// waits for its reply. A call still queued returns without being sent
// when ctx ends, after the client's PoolTimeout, or, unless it is the
// half-open probe, when the breaker opens; none of these is a failure of
// Redis.
func (s *Scripts) queue(ctx context.Context, probe bool, name string, sc *luaScript, c *call) (any, error) {
	q := &queued{ctx: ctx, probe: probe, name: name, sc: sc, c: c, since: time.Now(), done: make(chan struct{})}
	g := s.gate
	g.mu.Lock()
	if g.inFlight < g.limit {
		// Every sender left while this call was on its way here.
		g.inFlight++
		g.queue = append(g.queue, q)
		g.mu.Unlock()
		go s.drain(true)
	} else {
		g.queue = append(g.queue, q)
		g.mu.Unlock()
	}
	var tripped <-chan struct{}
	if !probe {
		tripped = s.breaker.tripped()
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	var err error
	select {
	case <-q.done:
		return q.v, q.err
	case <-tripped:
		err = ErrBreakerOpen
	case <-ctx.Done():
		err = fmt.Errorf("%w: %s: waiting for a connection: %w", ErrUnavailable, name, ctx.Err())
	case <-t.C:
		err = fmt.Errorf("%w: %s: waiting for a connection: %w", ErrUnavailable, name, redis.ErrPoolTimeout)
	}
	if q.withdraw() {
		s.breaker.Abandon(probe) // nothing was sent
		return nil, err
	}
	// A sender took it: it is sent, within the per-call timeout.
	<-q.done
	return q.v, q.err
}

// record tells the breaker the outcome of a call sent with the per-call
// timeout ending at deadline, on behalf of a caller whose context is ctx.
func (s *Scripts) record(ctx context.Context, probe bool, deadline time.Time, err error) {
	switch {
	case err == nil:
		s.breaker.Success(probe)
	case ctx.Err() != nil:
		// The caller gave up; that says nothing about Redis.
		s.breaker.Abandon(probe)
	case !time.Now().Before(deadline) && s.lagged(deadline):
		// This process ran too far behind to have read a reply in time:
		// its CPU (a burst of requests, a GC pause, a starved container),
		// not Redis. The call fails, the breaker does not count it. A Redis
		// that hangs while the process keeps up is still counted.
		s.lagCalls.Add(1)
		s.breaker.Abandon(probe)
	default:
		s.breaker.Failure(probe)
	}
}

func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
