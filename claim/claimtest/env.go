package claimtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/sqlite"
	"github.com/oncekey/oncekey/lua"
)

// Defaults of the Claimer an [Env] makes; options given to [New] or [Open]
// come after them and win.
const (
	// lease is shorter than the library's 30s so that a Redis lease left
	// behind by a timed-out call delays a window by seconds, not half a
	// minute.
	lease = 10 * time.Second
	// redisTimeout bounds each call to the in-process Redis: far above the
	// library's 50ms, since a test machine running -race is slow.
	redisTimeout = 2 * time.Second
)

// Env is the embedded default the checks run on: a SQLite file and an
// in-process Redis in front of one Claimer. It is safe for concurrent use;
// each check uses keys of its own.
type Env struct {
	// DB is the SQLite database of the durable store, for the tables of
	// the code under test (in transaction mode they commit with the
	// record).
	DB *sql.DB
	// Store is the durable store on DB.
	Store durable.Store[*sql.Tx]
	// Claimer is the Claimer the checks claim with: Store, with the
	// in-process Redis in front.
	Claimer *claim.Claimer[*sql.Tx]

	redis *miniredis.Miniredis
	close []func() error // in reverse order
}

// New opens an [Env] in tb's temporary folder and closes it when tb's test
// ends. opts configure the Claimer (claim.WithRetention, say); by default
// it has a 10s lease and logs nothing (claim.WithLogger to see its logs).
// It fails tb with Fatalf if the environment cannot be opened.
func New(tb testing.TB, opts ...claim.Option) *Env {
	tb.Helper()
	e, err := open(tb.TempDir(), opts)
	if err != nil {
		tb.Fatalf("claimtest: %v", err)
	}
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

// Open is [New] for code without a testing.TB (an Example, a TestMain): it
// makes a temporary folder of its own, which [Env.Close] removes.
func Open(opts ...claim.Option) (*Env, error) {
	dir, err := os.MkdirTemp("", "oncekey-claimtest-")
	if err != nil {
		return nil, err
	}
	e, err := open(dir, opts)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e.close = append([]func() error{func() error { return os.RemoveAll(dir) }}, e.close...)
	return e, nil
}

func open(dir string, opts []claim.Option) (e *Env, err error) {
	e = &Env{}
	defer func() {
		if err != nil {
			_ = e.Close()
		}
	}()
	ctx := context.Background()
	db, err := sqlite.Open(filepath.Join(dir, "oncekey.db"))
	if err != nil {
		return e, err
	}
	e.close = append(e.close, db.Close)
	if err := sqlite.Migrate(ctx, db); err != nil {
		return e, err
	}
	store, err := sqlite.New(db)
	if err != nil {
		return e, err
	}
	mr, err := miniredis.Run()
	if err != nil {
		return e, fmt.Errorf("in-process Redis: %w", err)
	}
	e.close = append(e.close, func() error { mr.Close(); return nil })
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	e.close = append(e.close, rdb.Close)
	// miniredis has no CONFIG GET, so the Claimer's start-up check of the
	// eviction policy would only log a warning; an in-process Redis evicts
	// nothing. Handing over the scripting methods alone skips it.
	base := []claim.Option{
		claim.WithRedis(scriptsOnly{rdb}, lua.Options{Timeout: redisTimeout}),
		claim.WithLease(lease),
		claim.WithLogger(discard),
	}
	c, err := claim.New(store, append(base, opts...)...)
	if err != nil {
		return e, err
	}
	e.DB, e.Store, e.Claimer, e.redis = db, store, c, mr
	return e, nil
}

// Close closes the database and the in-process Redis (and removes the
// folder [Open] made). It is safe to call more than once.
func (e *Env) Close() error {
	var errs []error
	for i := len(e.close) - 1; i >= 0; i-- {
		errs = append(errs, e.close[i]())
	}
	e.close = nil
	return errors.Join(errs...)
}

// flushRedis empties the in-process Redis, as a restart without
// persistence or a failover to an empty replica would.
func (e *Env) flushRedis() { e.redis.FlushAll() }

// scriptsOnly exposes only the scripting methods of a client.
type scriptsOnly struct{ redis.Scripter }

// discard is the default logger of the Claimer and the middleware.
var discard = slog.New(slog.NewTextHandler(io.Discard, nil))
