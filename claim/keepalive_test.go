package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/lua"
)

// slowRenew is a store whose renewals each take delay (a database under
// load, or a connection attempt that times out), then reach the real store,
// or, with refuse, fail with ErrUnavailable as if the database were
// unreachable. Every other method reaches the real store.
type slowRenew struct {
	storeapi.Store[pgx.Tx]
	delay  time.Duration
	refuse bool
	calls  atomic.Int64
}

func (s *slowRenew) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	s.calls.Add(1)
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		if !s.refuse {
			return ctx.Err()
		}
	}
	if s.refuse {
		return fmt.Errorf("%w: renew: connection timed out (injected)", durable.ErrUnavailable)
	}
	return s.Store.Renew(ctx, ref, tok, lease)
}

func TestLease_KeepAliveCancelsBeforeATakeoverIsPossible(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{withoutRed, withRedis} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			const lease = 1200 * time.Millisecond
			e := setup(t, mode, claim.WithLease(lease))
			st := &slowRenew{Store: e.store, delay: lease / 10, refuse: true}
			first := e.newClaimer(st, claim.WithLease(lease))
			r := req("k-expiring", "v1:a")
			out := mustClaim(t, first, r, claim.Acquired)
			work, stop := out.Lease.KeepAlive(context.WithoutCancel(t.Context()))
			defer stop()

			// Another worker polls for the key. Whenever it gets it, the
			// first worker must already have been told to stop.
			giveUp := time.Now().Add(20 * lease)
			for {
				o, err := e.c.Claim(t.Context(), r)
				if err != nil {
					t.Fatalf("second Claim: %v", err)
				}
				if o.Kind == claim.Acquired {
					if work.Err() == nil {
						t.Fatal("another worker took the key over while the first worker's work context was still live")
					}
					break
				}
				if o.Kind != claim.InProgress {
					t.Fatalf("second Claim = %v, want InProgress until the lease ends", o.Kind)
				}
				if time.Now().After(giveUp) {
					t.Fatal("the lease was never taken over")
				}
				time.Sleep(2 * time.Millisecond)
			}
			if cause := context.Cause(work); !errors.Is(cause, claim.ErrLeaseExpired) {
				t.Fatalf("cause = %v, want ErrLeaseExpired", cause)
			}
			if err := stop(); !errors.Is(err, claim.ErrLeaseExpired) {
				t.Fatalf("stop = %v, want ErrLeaseExpired", err)
			}
			if st.calls.Load() == 0 {
				t.Fatal("KeepAlive never tried to renew")
			}
			// Taken over now: the first worker's result is fenced.
			if err := out.Lease.Complete(t.Context(), result("late")); !errors.Is(err, claim.ErrFenced) {
				t.Fatalf("first worker's Complete after the takeover = %v, want ErrFenced", err)
			}
		})
	}
}

func TestLease_KeepAliveExpiryKeepsTheKey(t *testing.T) {
	t.Parallel()
	// A worker told to stop by ErrLeaseExpired was not necessarily replaced:
	// the key was not released, and its fenced Complete still succeeds
	// while no one took it over.
	const lease = 600 * time.Millisecond
	e := setup(t, withoutRed, claim.WithLease(lease))
	first, err := claim.New[pgx.Tx](&slowRenew{Store: e.store, delay: time.Millisecond, refuse: true}, claim.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	r := req("k-expired-kept", "v1:a")
	out := mustClaim(t, first, r, claim.Acquired)
	work, stop := out.Lease.KeepAlive(context.WithoutCancel(t.Context()))
	<-work.Done()
	if err := stop(); !errors.Is(err, claim.ErrLeaseExpired) {
		t.Fatalf("stop = %v, want ErrLeaseExpired", err)
	}
	rec, err := e.store.Get(t.Context(), e.ref(r))
	if err != nil || rec.Released || rec.Token != out.Lease.Token() {
		t.Fatalf("record after ErrLeaseExpired = %+v, %v; want still held by the first worker", rec, err)
	}
	if err := out.Lease.Complete(t.Context(), result("recorded")); err != nil {
		t.Fatalf("Complete after ErrLeaseExpired with no takeover = %v, want success", err)
	}
	mustClaim(t, e.c, r, claim.Replayed)
}

func TestLease_KeepAliveKeepsUpWithSlowRenewals(t *testing.T) {
	t.Parallel()
	// Renewals that take 35% of the lease each still keep it: the next one
	// is due a third of the lease after the previous was sent, not after
	// it came back. (Counted from its return, the second renewal would be
	// sent at 0.33+0.35+0.33 of the lease and come back at 1.37, past the
	// deadline of 1.33 less the margin.)
	const lease = time.Second
	e := setup(t, withoutRed, claim.WithLease(lease))
	st := &slowRenew{Store: e.store, delay: lease * 35 / 100}
	c, err := claim.New[pgx.Tx](st, claim.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	r := req("k-slow-renewals", "v1:a")
	out := mustClaim(t, c, r, claim.Acquired)
	work, stop := out.Lease.KeepAlive(context.WithoutCancel(t.Context()))
	select {
	case <-work.Done():
		t.Fatalf("work ended after %d renewals: %v", st.calls.Load(), context.Cause(work))
	case <-time.After(4 * lease):
	}
	if err := stop(); err != nil {
		t.Fatalf("stop = %v, want nil", err)
	}
	if n := st.calls.Load(); n < 5 {
		t.Fatalf("%d renewals in four leases, want at least 5", n)
	}
	mustClaim(t, e.c, r, claim.InProgress)
}

// slowClaim is a store whose claims answer delay after they were sent: the
// lease, counted from the sending, is partly gone when the work starts.
type slowClaim struct {
	storeapi.Store[pgx.Tx]
	delay time.Duration
}

func (s *slowClaim) Claim(ctx context.Context, tx pgx.Tx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	r, err := s.Store.Claim(ctx, tx, p)
	time.Sleep(s.delay)
	return r, err
}

func TestLease_KeepAliveRenewsAtOnceAfterASlowClaim(t *testing.T) {
	t.Parallel()
	// A claim that came back after 65% of the lease is renewed at once:
	// counted from the start of KeepAlive, the first renewal would be due
	// at 0.98 of the lease, after the expiry at 0.9 (the margin left).
	const lease = time.Second
	e := setup(t, withoutRed, claim.WithLease(lease))
	c, err := claim.New[pgx.Tx](&slowClaim{Store: e.store, delay: lease * 65 / 100}, claim.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	r := req("k-slow-claim", "v1:a")
	out := mustClaim(t, c, r, claim.Acquired)
	work, stop := out.Lease.KeepAlive(context.WithoutCancel(t.Context()))
	select {
	case <-work.Done():
		t.Fatalf("work ended: %v", context.Cause(work))
	case <-time.After(2 * lease):
	}
	if err := stop(); err != nil {
		t.Fatalf("stop = %v, want nil", err)
	}
	mustClaim(t, e.c, r, claim.InProgress)
}

func TestLease_KeepAliveIsNotDelayedBySlowRedis(t *testing.T) {
	t.Parallel()
	// Redis's copy of the lease takes 80% of the lease to renew (within
	// its timeout), the database 35%. The durable renewals, which are the
	// lease, keep their schedule: waiting for Redis (until the renewal's
	// deadline, 1.0 of the lease) before sending the next would bring it
	// back at 1.35, past the expiry at 1.23 (the first renewal's send at
	// 0.33, plus the lease, less the margin), for an accelerator.
	const lease = time.Second
	e := setup(t, withRedis, claim.WithLease(lease))
	st := &slowRenew{Store: e.store, delay: lease * 35 / 100}
	e.loadScripts()
	var slowed atomic.Int64
	slow := &faultyRedis{Scripter: e.rdb, before: func(script string) {
		if script == "renew.lua" {
			slowed.Add(1)
			time.Sleep(lease * 8 / 10)
		}
	}}
	c, err := claim.New[pgx.Tx](st, claim.WithLease(lease),
		claim.WithRedis(slow, lua.Options{Prefix: e.prefix, Timeout: 3 * lease}))
	if err != nil {
		t.Fatal(err)
	}
	r := req("k-slow-redis-renewals", "v1:a")
	out := mustClaim(t, c, r, claim.Acquired)
	work, stop := out.Lease.KeepAlive(context.WithoutCancel(t.Context()))
	select {
	case <-work.Done():
		t.Fatalf("work ended: %v", context.Cause(work))
	case <-time.After(3 * lease):
	}
	if err := stop(); err != nil {
		t.Fatalf("stop = %v, want nil", err)
	}
	if slowed.Load() == 0 {
		t.Fatal("Redis's copy was never renewed")
	}
	mustClaim(t, e.c, r, claim.InProgress)
}

// refuseUntil is a store that refuses renewals (unreachable) until a time,
// then passes them on.
type refuseUntil struct {
	storeapi.Store[pgx.Tx]
	until atomic.Int64 // unix nanoseconds
	calls atomic.Int64
}

func (s *refuseUntil) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	s.calls.Add(1)
	if time.Now().UnixNano() < s.until.Load() {
		return fmt.Errorf("%w: renew: connection refused (injected)", durable.ErrUnavailable)
	}
	return s.Store.Renew(ctx, ref, tok, lease)
}

// TestLease_KeepAliveRenewsAfterTheWorkWasToldToStop: ErrLeaseExpired
// tells the work to stop, but the worker still holds the key until it
// records its outcome, so the renewals go on: a slow renewal in flight at
// the expiry is not cut, and a store that comes back after it is renewed
// on. Either way no one can take the key over meanwhile. (Stopping the
// renewals at the expiry let the lease lapse under a loaded database and a
// retry ran the effect a second time.)
func TestLease_KeepAliveRenewsAfterTheWorkWasToldToStop(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second // margin 0.1 lease, renewals every third
	e := setup(t, withoutRed, claim.WithLease(lease))
	t.Run("slow renewal in flight", func(t *testing.T) {
		t.Parallel()
		// The first renewal is sent at 0.33 lease and answers at 0.95:
		// after the expiry (0.9), before the deadline (1.0).
		st := &slowRenew{Store: e.store, delay: lease * 62 / 100}
		c, err := claim.New[pgx.Tx](st, claim.WithLease(lease))
		if err != nil {
			t.Fatal(err)
		}
		keptAfterExpiry(t, e, c, "k-renew-in-flight")
	})
	t.Run("store back after the expiry", func(t *testing.T) {
		t.Parallel()
		st := &refuseUntil{Store: e.store}
		st.until.Store(time.Now().Add(lease * 95 / 100).UnixNano())
		c, err := claim.New[pgx.Tx](st, claim.WithLease(lease))
		if err != nil {
			t.Fatal(err)
		}
		keptAfterExpiry(t, e, c, "k-store-back")
	})
}

func keptAfterExpiry(t *testing.T, e *env, c *claim.Claimer[pgx.Tx], key string) {
	t.Helper()
	const lease = 2 * time.Second
	r := req(key, "v1:a")
	claimed := time.Now()
	out := mustClaim(t, c, r, claim.Acquired)
	work, stop := out.Lease.KeepAlive(context.WithoutCancel(t.Context()))
	<-work.Done()
	if cause := context.Cause(work); !errors.Is(cause, claim.ErrLeaseExpired) {
		t.Fatalf("work ended with %v, want ErrLeaseExpired", cause)
	}
	// Well past the lease as it stood at the expiry: held only if the
	// renewals went on.
	time.Sleep(time.Until(claimed.Add(lease * 3 / 2)))
	mustClaim(t, e.c, r, claim.InProgress)
	if err := stop(); !errors.Is(err, claim.ErrLeaseExpired) {
		t.Fatalf("stop = %v, want ErrLeaseExpired", err)
	}
	if err := out.Lease.Complete(t.Context(), result("recorded")); err != nil {
		t.Fatalf("Complete = %v, want success (no one took the key over)", err)
	}
	mustClaim(t, e.c, r, claim.Replayed)
}
