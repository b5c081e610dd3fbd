package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable/postgres"
)

func runRedis(e *env, args []string) error {
	fs := newFlags(e, "redis", "redis check [flags]\n\n"+
		"Checks a Redis server for oncekey: maxmemory-policy must be noeviction (why: go doc\n"+
		"github.com/oncekey/oncekey/lua, Eviction),\n"+
		"version 5.0 or later (the scripts read TIME before writing), every cluster slot served when in cluster mode; and measures PING\n"+
		"latency. Reads no key. With -database-url it also checks that PostgreSQL keeps the commits it\n"+
		"acknowledges (the durability line of stats; DATABASE_URL is not read here). Exits 1 when a check fails.")
	url := fs.String("redis-url", "", "Redis URL (default $REDIS_URL)")
	dbURL := fs.String("database-url", "", "also check the durability settings of this PostgreSQL database (synchronous_commit, fsync, full_page_writes, synchronous standbys)")
	pings := fs.Int("pings", 10, "PINGs to measure latency with (1 to 1000)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on the whole command")
	pos, err := parse(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) < 1 || pos[0] != "check" {
		return usagef("want: oncekey redis check [flags]")
	}
	if len(pos) > 1 {
		return usagef("unexpected argument %q", pos[1])
	}
	if *pings < 1 || *pings > 1000 {
		return usagef("-pings must be 1 to 1000, got %d", *pings)
	}
	if *timeout <= 0 {
		return usagef("-timeout must be positive")
	}
	source := "-redis-url"
	if *url == "" {
		*url, source = e.getenv("REDIS_URL"), "REDIS_URL"
	}
	if *url == "" {
		return usagef("no Redis: set -redis-url or REDIS_URL")
	}
	opt, err := parseRedisURL(*url, source)
	if err != nil {
		return err
	}
	var pgCfg *pgxpool.Config
	if *dbURL != "" {
		if pgCfg, err = parseDatabaseURL(*dbURL, "-database-url"); err != nil {
			return err
		}
	}
	opt.MaxRetries = -1
	opt.DialTimeout = *timeout
	redis.SetLogger(quietLogger{})
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := contextTimeout(e, *timeout)
	defer cancel()

	info, err := c.Info(ctx, "server", "memory", "cluster").Result()
	if err != nil {
		return fmt.Errorf("redis unreachable (%s): %v", opt.Addr, err)
	}
	fields := parseInfo(info)
	var failed []string
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)

	version := fields["redis_version"]
	verdict := "ok"
	// claim.lua reads TIME before it writes: that needs effects
	// replication, the default from Redis 5.
	if !atLeast(version, 5, 0) {
		verdict = "FAIL: 5.0 or later needed"
		failed = append(failed, "version")
	}
	fmt.Fprintf(w, "version\t%s\t%s\n", version, verdict)

	policy := fields["maxmemory_policy"]
	verdict = "ok"
	if policy != "noeviction" {
		verdict = "FAIL: noeviction needed (keys may be evicted)"
		failed = append(failed, "maxmemory-policy")
	}
	fmt.Fprintf(w, "maxmemory-policy\t%s\t%s\n", policy, verdict)

	if fields["cluster_enabled"] == "1" {
		ci, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("redis cluster info: %v", err)
		}
		cf := parseInfo(ci)
		verdict = "ok"
		if cf["cluster_state"] != "ok" || cf["cluster_slots_ok"] != "16384" {
			verdict = "FAIL: not every slot is served"
			failed = append(failed, "cluster slots")
		}
		fmt.Fprintf(w, "cluster slots\t%s/16384 ok, state %s\t%s\n", cf["cluster_slots_ok"], cf["cluster_state"], verdict)
	} else {
		fmt.Fprintf(w, "cluster slots\tnot in cluster mode\tok\n")
	}

	lat := make([]time.Duration, 0, *pings)
	for range *pings {
		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis ping: %v", err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	fmt.Fprintf(w, "latency\tmin %s, median %s, max %s over %d PINGs\tinfo\n",
		lat[0].Round(time.Microsecond), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond), len(lat))
	if pgCfg != nil {
		verdict, err := checkDurability(ctx, pgCfg)
		if err != nil {
			w.Flush()
			return err
		}
		if verdict != "ok" {
			failed = append(failed, "postgres durability")
		}
		fmt.Fprintf(w, "postgres durability\t%s:%d\t%s\n", pgCfg.ConnConfig.Host, pgCfg.ConnConfig.Port, verdict)
	}
	w.Flush()
	if len(failed) > 0 {
		return fmt.Errorf("check failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

// parseInfo reads "field:value" lines of INFO and CLUSTER INFO.
func parseInfo(s string) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// atLeast reports whether version "major.minor.patch" is at least
// major.minor.
func atLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// quietLogger drops go-redis's own log lines (dial retries): the command
// reports the error itself.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// parseRedisURL parses the Redis URL as go-redis does. Its errors name
// source (-redis-url or REDIS_URL) and the part that failed, never the URL
// nor go-redis's error: both can hold the password.
func parseRedisURL(raw, source string) (*redis.Options, error) {
	if p := urlProblem(raw); p != "" {
		return nil, usagef("%s: %s (%s)", source, p, percentEncode)
	}
	opt, err := redis.ParseURL(raw)
	if err == nil {
		return opt, nil
	}
	msg := err.Error()
	part := "cannot be parsed"
	switch {
	case strings.Contains(msg, "invalid URL scheme"):
		part = "the scheme must be redis://, rediss:// or unix://"
	case strings.Contains(msg, "invalid database number"), strings.Contains(msg, "invalid URL path"):
		part = "invalid database number (the path is /N)"
	case strings.Contains(msg, "unexpected option"):
		part = "unknown query parameter"
	case strings.Contains(msg, "redis: invalid"):
		part = "invalid query parameter value"
	case strings.Contains(msg, "unix socket path"):
		part = "empty unix socket path"
	}
	return nil, usagef("%s: %s (%s)", source, part, percentEncode)
}

// checkDurability reads what the store's Stats reports as Durability
// (postgres.CheckDurability): "ok", or "FAIL: " and each setting that can
// lose an acknowledged commit.
func checkDurability(ctx context.Context, cfg *pgxpool.Config) (string, error) {
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", fmt.Errorf("database: %v", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return "", fmt.Errorf("database unreachable (%s:%d): %v", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	err = postgres.CheckDurability(ctx, pool)
	switch {
	case err == nil:
		return "ok", nil
	case errors.Is(err, postgres.ErrNotDurable):
		return "FAIL: " + strings.TrimPrefix(strings.TrimPrefix(err.Error(), postgres.ErrNotDurable.Error()), ": "), nil
	}
	return "", fmt.Errorf("postgres durability: %v", err)
}
