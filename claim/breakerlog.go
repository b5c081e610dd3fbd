package claim

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// breakerLogEvery is the least time between two warnings that the Redis
// breaker opened. A Redis that flaps opens the breaker again after every
// cool-down (1s by default): one line per change would flood the log when
// it matters least. An opening within it is not logged but counted (in the
// next opening line, and in oncekey.redis.breaker.opens, which counts
// every opening); a closing is logged whenever the last line said open, so
// there is at most one closing line per opening line, and the last line
// always tells where claims go, but for an opening not logged yet: that
// one is logged at the breaker's first change (a failed probe, one
// cool-down later) past the 10s. The oncekey.redis.breaker gauge always
// shows the current state.
const breakerLogEvery = 10 * time.Second

// breakerMsg is the message of the breaker's warnings; their state
// attribute ("open", "closed") is where claims go from then on.
const breakerMsg = "oncekey: redis breaker"

// breakerLog turns the Redis breaker's state changes into warnings and the
// openings counter. Its method runs under the breaker's lock (see
// fastpath.Options.OnStateChange): it only logs and counts.
type breakerLog struct {
	log *slog.Logger
	m   func() *meters // the Claimer's, set after the breaker is made
	now func() time.Time

	mu         sync.Mutex
	prev       fastpath.BreakerState // the breaker's state before this change
	loggedOpen bool                  // the last warning said open
	lastOpen   time.Time             // when the last opening was logged
	suppressed int                   // openings not logged since then
}

func (b *breakerLog) change(s fastpath.BreakerState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	prev := b.prev
	b.prev = s
	opening := s == fastpath.BreakerOpen && prev == fastpath.BreakerClosed
	if opening {
		if m := b.m(); m != nil {
			m.breakerOpened()
		}
	}
	// Half-open is open as far as claims are concerned: all but the probe
	// go to the durable store.
	open := s != fastpath.BreakerClosed
	switch {
	case open == b.loggedOpen:
		// A probe going out, or failing: claims go where the last line
		// said.
		b.log.Debug(breakerMsg+" probe", logkeys.State, s.String())
	case !open:
		b.loggedOpen = false
		b.log.Warn(breakerMsg, logkeys.State, "closed", logkeys.Claims, "use Redis again")
	default:
		now := b.now()
		if !b.lastOpen.IsZero() && now.Sub(b.lastOpen) < breakerLogEvery {
			if opening {
				b.suppressed++
			}
			b.log.Debug(breakerMsg+" probe", logkeys.State, s.String())
			return
		}
		b.loggedOpen, b.lastOpen = true, now
		args := []any{logkeys.State, "open", logkeys.Claims, "go to the durable store alone (correct, slower) until a probe after the cool-down succeeds"}
		if b.suppressed > 0 {
			args = append(args, logkeys.Suppressed, b.suppressed)
			b.suppressed = 0
		}
		b.log.Warn(breakerMsg, args...)
	}
}

// breakerOpened counts an opening of the Redis breaker.
func (m *meters) breakerOpened() { m.breakerOpens.Add(context.Background(), 1) }
