package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bsm/redislock"

	"github.com/oncekey/oncekey/internal/fastpath"
)

// The Redis-only peer of issue 30: bsm/redislock's Obtain, one EVALSHA of
// its SET NX PX script, with no retry (its default). It stores no result
// and consults no database: a duplicate learns only that the key is held.
// That is the least a Redis-only idempotency guard can do for a duplicate,
// so it bounds what such a peer costs; the storm, the burst and the replay
// report the library's throughput against it. The other peer,
// go-idempotency, is not measured: no module of that name is served by
// this machine's module proxy (every candidate answered 403).

// peerTTL is how long a peer lock holds its key: past any workload, so a
// key is obtained once and every later Obtain finds it held.
const peerTTL = 10 * time.Minute

// peerKey is the peer's lock key for an idempotency key: built as the
// library builds its own (a digest under the run's prefix, which the run
// deletes at its end), so both sides pay the same to name the key.
func peerKey(e *env, key string) string {
	return fastpath.KeysFor(e.prefix, scope(key).Ref(nil)).Record + ":peer"
}

// peerObtain runs redislock's Obtain for key on lk: acquired the first
// time, busy after.
func peerObtain(ctx context.Context, e *env, lk *redislock.Client, key string) (outcome, error) {
	_, err := lk.Obtain(ctx, peerKey(e, key), peerTTL, nil)
	switch {
	case err == nil:
		return oAcquired, nil
	case errors.Is(err, redislock.ErrNotObtained):
		return oBusy, nil
	}
	return oOther, fmt.Errorf("peer-redislock: %w", err)
}

// throughput is a variant's requests per second over its timed rounds.
func throughput(v *variant) float64 {
	if v.st.elapsed <= 0 {
		return 0
	}
	return float64(v.st.ops) / v.st.elapsed.Seconds()
}

// peerRatio is the extra that compares variant lib with peer by
// throughput, against target (at least; 0: reported only).
func peerRatio(name string, lib, peer *variant, target float64, note string) extra {
	r := ratio(throughput(lib), throughput(peer))
	x := extra{Name: name, Value: r, Note: note}
	if target > 0 {
		x.Target, x.Meets = fmt.Sprintf(">= %.2f", target), boolp(r >= target)
	}
	return x
}
