package backend

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/durable/sqlite"
	"github.com/oncekey/oncekey/lua"
)

// connectTimeout bounds the first contact with a named server.
const connectTimeout = 10 * time.Second

// DefaultRedisTimeout is the examples' budget for each Redis call
// (lua.Options.Timeout), when Config.RedisTimeout is zero. It is ten times
// the library's default (50ms) because the examples run on laptops and
// shared CI machines, where a busy CPU delays the in-process Redis too:
// calls that time out go to the durable store alone and, repeated, open
// the breaker (slower, never wrong). In production keep the default, or
// measure.
const DefaultRedisTimeout = 500 * time.Millisecond

// Config says which services to use. The zero value is the embedded
// default.
type Config struct {
	// Name names the program ("orders"); it is part of the temporary
	// folder's name.
	Name string
	// DatabaseURL names a PostgreSQL server. Empty: a SQLite file.
	DatabaseURL string
	// RedisURL names a Redis server. Empty: an in-process miniredis.
	RedisURL string
	// DataDir is the folder of the SQLite file, created if needed and kept.
	// Empty: a fresh folder under the OS temporary directory, removed by
	// [Backend.Close]. Unused with DatabaseURL.
	DataDir string
	// RedisPrefix starts every Redis key name (lua.Options.Prefix).
	// Defaults to the library's prefix; tests set their own.
	RedisPrefix string
	// RedisTimeout bounds each Redis call. Defaults to
	// [DefaultRedisTimeout].
	RedisTimeout time.Duration
	// Logger gets the warning about a named Redis that does not answer.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// RegisterFlags registers -postgres, -redis and -data on fs, filling c.
// The defaults of -postgres and -redis are DATABASE_URL and REDIS_URL as
// getenv reports them (os.Getenv in a program; tests pass their own).
func (c *Config) RegisterFlags(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&c.DatabaseURL, "postgres", getenv("DATABASE_URL"),
		"PostgreSQL URL (default $DATABASE_URL); empty: an embedded SQLite file")
	fs.StringVar(&c.RedisURL, "redis", getenv("REDIS_URL"),
		"Redis URL (default $REDIS_URL); empty: an in-process Redis (miniredis)")
	fs.StringVar(&c.DataDir, "data", "",
		"folder for the embedded SQLite file, kept after exit (default: a temporary folder, removed at exit)")
}

// Backend is the pair of services a program runs on: one durable store
// (exactly one of Postgres and SQLite is set) and one Redis.
type Backend struct {
	// Postgres and Pool are set when a PostgreSQL server was named.
	Postgres durable.Store[pgx.Tx]
	Pool     *pgxpool.Pool
	// SQLite is set otherwise: the embedded store, on DB, which holds the
	// program's own tables too.
	SQLite durable.Store[*sql.Tx]
	DB     *sql.DB
	// Redis is the named server, or the in-process one.
	Redis *redis.Client
	// scripter is what the Claimer gets: Redis, or for miniredis a
	// wrapper that hides the rest of the client (see openMiniredis).
	scripter redis.Scripter
	// Lua configures the Redis scripts.
	Lua lua.Options

	describe []string
	closers  []func() // run in reverse order by Close
}

// Open opens the services cfg names, and the embedded stand-ins of those it
// does not, and migrates the durable store's schema. ctx bounds the first
// contact with each server (at most 10s). On error everything opened so far
// is closed.
//
// A named Redis that does not answer is no error: Redis only accelerates.
// Open logs a warning (Config.Logger) that the program runs on the durable
// store alone, and the Claimer keeps the client: its calls fail fast (the
// claim's breaker opens) and go to the durable store, and Redis is used
// again once it answers.
//
// Errors: [ErrConfig] for a URL that does not parse, [ErrUnreachable] for a
// named PostgreSQL that does not answer, and the durable store's errors
// from opening and migrating.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if cfg.RedisTimeout == 0 {
		cfg.RedisTimeout = DefaultRedisTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := &Backend{Lua: lua.Options{Prefix: cfg.RedisPrefix, Timeout: cfg.RedisTimeout}}
	if err := b.open(ctx, cfg); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Backend) open(ctx context.Context, cfg Config) error {
	var err error
	if cfg.DatabaseURL != "" {
		err = b.openPostgres(ctx, cfg.DatabaseURL)
	} else {
		err = b.openSQLite(ctx, cfg)
	}
	if err != nil {
		return err
	}
	if cfg.RedisURL != "" {
		return b.openRedis(ctx, cfg.RedisURL, cfg.Logger)
	}
	return b.openMiniredis()
}

func (b *Backend) openPostgres(ctx context.Context, url string) error {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("%w: PostgreSQL URL: %w", ErrConfig, err)
	}
	// lock_timeout and idle_in_transaction_session_timeout on every
	// session, so a paused worker cannot hold a row lock forever.
	if err := postgres.ConfigurePool(pcfg); err != nil {
		return err
	}
	where := fmt.Sprintf("%s:%d/%s", pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, pcfg.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("%w: PostgreSQL at %s: %w", ErrUnreachable, where, err)
	}
	b.closers = append(b.closers, pool.Close)
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("%w: PostgreSQL at %s: %w", ErrUnreachable, where, err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		return err
	}
	store, err := postgres.New(pool)
	if err != nil {
		return err
	}
	b.Postgres, b.Pool = store, pool
	b.describe = append(b.describe, "durable store: PostgreSQL at "+where+" (named by -postgres or DATABASE_URL)")
	return nil
}

func (b *Backend) openSQLite(ctx context.Context, cfg Config) error {
	dir, kept := cfg.DataDir, true
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "oncekey-"+cfg.Name+"-"); err != nil {
			return err
		}
		kept = false
		b.closers = append(b.closers, func() { _ = os.RemoveAll(dir) })
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "oncekey.db")
	db, err := sqlite.Open(path)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, func() { _ = db.Close() })
	if err := sqlite.Migrate(ctx, db); err != nil {
		return err
	}
	store, err := sqlite.New(db)
	if err != nil {
		return err
	}
	b.SQLite, b.DB = store, db
	line := "durable store: SQLite " + path + " (embedded default: no -postgres or DATABASE_URL"
	if kept {
		line += "; kept after exit)"
	} else {
		line += "; removed at exit, -data DIR keeps it)"
	}
	b.describe = append(b.describe, line)
	return nil
}

func (b *Backend) openRedis(ctx context.Context, url string, log *slog.Logger) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("%w: Redis URL: %w", ErrConfig, err)
	}
	// Calls end at their context's deadline, so a slow Redis costs at most
	// the scripts' budget before the claim goes to the durable store.
	opt.ContextTimeoutEnabled = true
	// One dial per call: a Redis that is down costs a refused connection,
	// not five dials 100ms apart, before the claim goes to the durable
	// store (the call's retries still cover a dropped connection).
	opt.DialerRetries = 1
	// go-redis logs every failed dial on its own logger, once per call
	// while Redis is down: to the program's logger at debug level (-v),
	// since Open warns once.
	redisLogOnce.Do(func() { redis.SetLogger(redisLog{log}) })
	rdb := redis.NewClient(opt)
	b.closers = append(b.closers, func() { _ = rdb.Close() })
	where := fmt.Sprintf("%s/%d", opt.Addr, opt.DB)
	b.Redis, b.scripter = rdb, rdb
	if err := rdb.Ping(ctx).Err(); err != nil {
		// Redis only accelerates: the durable store arbitrates every claim
		// without it. Keep the client, whose calls fail fast until it
		// answers, and say so once, loudly.
		store := "PostgreSQL"
		if b.SQLite != nil {
			store = "SQLite"
		}
		log.Warn("redis unreachable: running on "+store+" alone; Redis is used again once it answers",
			"redis", where, "err", err)
		b.describe = append(b.describe, "redis: "+where+" unreachable (named by -redis or REDIS_URL); running on "+store+" alone until it answers")
		return nil
	}
	b.describe = append(b.describe, "redis: "+where+" (named by -redis or REDIS_URL)")
	return nil
}

// redisLogOnce sets go-redis's logger, which is the process's, once.
var redisLogOnce sync.Once

// redisLog is go-redis's logger on slog, at debug level.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}

func (b *Backend) openMiniredis() error {
	mr, err := miniredis.Run()
	if err != nil {
		return err
	}
	b.closers = append(b.closers, mr.Close)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	b.closers = append(b.closers, func() { _ = rdb.Close() })
	// miniredis has no CONFIG GET, so the Claimer's start-up check of the
	// eviction policy would only log a warning; and an in-process Redis
	// evicts nothing. Handing over the scripting methods alone skips it.
	b.Redis, b.scripter = rdb, scriptsOnly{rdb}
	b.describe = append(b.describe, "redis: in-process miniredis (embedded default: no -redis or REDIS_URL)")
	return nil
}

// Embedded reports whether the durable store is the embedded SQLite file.
func (b *Backend) Embedded() bool { return b.SQLite != nil }

// Describe returns one line per service: which one runs, and why.
func (b *Backend) Describe() []string { return append([]string(nil), b.describe...) }

// ClaimOptions returns the options that put b's Redis in front of a
// Claimer.
func (b *Backend) ClaimOptions() []claim.Option {
	return []claim.Option{claim.WithRedis(b.scripter, b.Lua)}
}

// scriptsOnly exposes only the scripting methods of a client.
type scriptsOnly struct{ redis.Scripter }

// Close closes everything Open opened, the temporary folder included. It
// is safe to call more than once.
func (b *Backend) Close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	b.closers = nil
}
