package fastpath

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// MaxWatchedKeys bounds the keys one Scripts watches at once: each is a
// subscription on a connection of its own. A waiter past the bound polls.
const MaxWatchedKeys = 128

// ErrNoWatch is returned by [Scripts.Watch] when this client cannot
// subscribe (it is not a go-redis client with sharded pub/sub, or the
// bound of [MaxWatchedKeys] is reached): the caller polls.
var ErrNoWatch = errors.New("fastpath: cannot watch the key: poll")

// subscriber is what a go-redis client offers for sharded pub/sub
// (*redis.Client, *redis.ClusterClient).
type subscriber interface {
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// A Watch is woken each time the holder of its key finishes (complete.lua
// caches the result or its marker) or lets go (release.lua), on any
// process. Wakes are hints: one may be lost (a reconnect, a finish whose
// Redis step failed), so a waiter still polls, more slowly.
type Watch struct {
	// C receives a value after each wake; it holds one, so wakes that
	// arrive while the waiter is busy count as one.
	C   <-chan struct{}
	c   chan struct{}
	hub *wakeHub
	sub *wakeSub
}

// Close ends the watch; the key's subscription closes with its last watch.
func (w *Watch) Close() {
	w.hub.leave(w)
}

type wakeHub struct {
	mu   sync.Mutex
	subs map[string]*wakeSub
}

// wakeSub is one key's subscription, shared by the watches of the key in
// this process.
type wakeSub struct {
	ch      string
	ps      *redis.PubSub
	ready   chan struct{} // closed once subscribed, or failed (err)
	err     error
	watches map[*Watch]struct{}
}

// Watch subscribes to the wakes of k and returns once the subscription is
// confirmed by Redis, so that any finish after Watch returns wakes it.
// ctx bounds the wait together with the per-call timeout. Errors:
// [ErrNoWatch], [ErrBreakerOpen], [ErrUnavailable] (the subscription
// failed: before Redis 7, which has no sharded pub/sub, always).
func (s *Scripts) Watch(ctx context.Context, k Keys) (*Watch, error) {
	sc, ok := s.c.(subscriber)
	if !ok {
		return nil, ErrNoWatch
	}
	if s.breaker.State() == BreakerOpen {
		return nil, ErrBreakerOpen
	}
	ch := k.Wake()
	c := make(chan struct{}, 1)
	w := &Watch{C: c, c: c, hub: &s.wake}
	h := &s.wake
	h.mu.Lock()
	sub, ok := h.subs[ch]
	if !ok {
		if len(h.subs) >= MaxWatchedKeys {
			h.mu.Unlock()
			return nil, ErrNoWatch
		}
		sub = &wakeSub{ch: ch, ready: make(chan struct{}), watches: map[*Watch]struct{}{}}
		if h.subs == nil {
			h.subs = map[string]*wakeSub{}
		}
		h.subs[ch] = sub
		go s.subscribe(sc, sub)
	}
	sub.watches[w] = struct{}{}
	w.sub = sub
	h.mu.Unlock()
	select {
	case <-sub.ready:
	case <-ctx.Done():
		w.Close()
		return nil, fmt.Errorf("%w: watch: %w", ErrUnavailable, ctx.Err())
	}
	if sub.err != nil {
		w.Close()
		return nil, sub.err
	}
	return w, nil
}

// Watching returns how many watches of k this process holds on a
// confirmed subscription: those a finish of k's holder wakes now. For
// tests and diagnostics.
func (s *Scripts) Watching(k Keys) int {
	h := &s.wake
	h.mu.Lock()
	sub, ok := h.subs[k.Wake()]
	h.mu.Unlock()
	if !ok {
		return 0
	}
	select {
	case <-sub.ready:
	default:
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if sub.err != nil {
		return 0
	}
	return len(sub.watches)
}

// subscribe opens sub's subscription, waits for Redis to confirm it (one
// per-call timeout at most), then hands each wake to the watches until the
// subscription is closed.
func (s *Scripts) subscribe(sc subscriber, sub *wakeSub) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	ps := sc.SSubscribe(ctx, sub.ch)
	_, err := ps.Receive(ctx) // the subscription's confirmation
	cancel()
	h := &s.wake
	h.mu.Lock()
	if err != nil {
		sub.err = fmt.Errorf("%w: watch: %w", ErrUnavailable, err)
		if h.subs[sub.ch] == sub {
			delete(h.subs, sub.ch)
		}
		h.mu.Unlock()
		close(sub.ready)
		_ = ps.Close()
		return
	}
	sub.ps = ps
	closed := len(sub.watches) == 0 // every watch left while it subscribed
	if closed && h.subs[sub.ch] == sub {
		delete(h.subs, sub.ch)
	}
	h.mu.Unlock()
	close(sub.ready)
	if closed {
		_ = ps.Close()
		return
	}
	for range ps.Channel() {
		h.mu.Lock()
		for w := range sub.watches {
			select {
			case w.c <- struct{}{}:
			default:
			}
		}
		h.mu.Unlock()
	}
}

func (h *wakeHub) leave(w *Watch) {
	h.mu.Lock()
	sub := w.sub
	if _, ok := sub.watches[w]; !ok {
		h.mu.Unlock()
		return
	}
	delete(sub.watches, w)
	var ps *redis.PubSub
	if len(sub.watches) == 0 && sub.ps != nil {
		ps = sub.ps
		if h.subs[sub.ch] == sub {
			delete(h.subs, sub.ch)
		}
	}
	h.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
}
