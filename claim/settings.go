package claim

import (
	"context"
	"log/slog"
	"time"

	"github.com/oncekey/oncekey/internal/logkeys"
)

// States of a Claimer's settings check (Claimer.settings).
const (
	settingsUnread int32 = iota
	settingsReading
	settingsRead
)

const (
	// settingsTimeout bounds the read of the store's settings.
	settingsTimeout = 2 * time.Second
	// settingsRetryAfter is how long after a failed read the next claim
	// tries again: a store that is down is not asked on every claim, and
	// the failure is logged at most this often.
	settingsRetryAfter = 30 * time.Second
)

// settingsReader is a store that can tell, in one round trip, whether the
// database can lose a commit it acknowledged (durability, "" when it cannot;
// see postgres.CheckDurability) and whether its sessions lack the lock and
// idle-in-transaction timeouts postgres.ConfigurePool sets (timeouts, ""
// when they have them): durable/postgres.
type settingsReader interface {
	SessionSettings(ctx context.Context) (durability, timeouts string, err error)
}

// initSettings marks the settings check done at once when there is nothing
// to read (a store that cannot tell: durable/sqlite) or nowhere to report
// it (no logger that writes warnings, no MeterProvider for the
// oncekey.durable.degraded gauge): no claim then pays for it.
func (c *Claimer[TTx]) initSettings() {
	_, ok := c.store.(settingsReader)
	if !ok || (!c.metrics.on && !c.log.Enabled(context.Background(), slog.LevelWarn)) {
		c.settings.Store(settingsRead)
	}
}

// checkSettings starts, once per Claimer, the read of the store's settings
// (see settingsReader) and reports what it finds: a warning and the
// oncekey.durable.degraded gauge when the database can lose acknowledged
// commits, a warning when the pool's sessions lack the timeouts. Every
// path that claims calls it (prepare: Claim, Do, DoTx, the adapters'
// claims in a transaction; Operation, which the adapters' resume reads
// through; Sweep), so none can miss it. The read runs on its own
// goroutine, bounded by settingsTimeout: no claim waits for it, none holds
// a connection of the pool for it while a transaction of its own is open.
// A failed read is logged and tried again by a claim settingsRetryAfter
// later.
func (c *Claimer[TTx]) checkSettings() {
	if c.settings.Load() != settingsUnread {
		return
	}
	if at := c.settingsRetry.Load(); at != 0 && time.Now().UnixNano() < at {
		return
	}
	if !c.settings.CompareAndSwap(settingsUnread, settingsReading) {
		return
	}
	go c.readSettings(c.store.(settingsReader))
}

func (c *Claimer[TTx]) readSettings(s settingsReader) {
	ctx, cancel := context.WithTimeout(context.Background(), settingsTimeout)
	durability, timeouts, err := s.SessionSettings(ctx)
	cancel()
	if err != nil {
		c.settingsRetry.Store(time.Now().Add(settingsRetryAfter).UnixNano())
		c.settings.Store(settingsUnread)
		c.log.Warn("oncekey: could not read the database's settings (durability, timeouts); a later claim tries again", logkeys.Err, err)
		return
	}
	c.settings.Store(settingsRead)
	if durability != "" {
		c.metrics.degraded.Store(true)
		c.log.Warn("oncekey: the database can lose acknowledged commits; a lost claim or completion can run again", logkeys.Settings, durability)
	}
	if timeouts != "" {
		c.log.Warn("oncekey: the pool is not configured with postgres.ConfigurePool", logkeys.Settings, timeouts)
	}
}
