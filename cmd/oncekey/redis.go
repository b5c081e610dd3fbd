package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
)

func runRedis(e *env, args []string) error {
	fs := newFlags(e, "redis", "redis check [flags]\n\n"+
		"Checks a Redis server for oncekey: maxmemory-policy must be noeviction (otherwise Redis may\n"+
		"evict leases and generations; the store still arbitrates, but the fast path degrades),\n"+
		"version 5.0 or later (the scripts read TIME before writing), every cluster slot served when in cluster mode; and measures PING\n"+
		"latency. Reads no key. Exits 1 when a check fails.")
	url := fs.String("redis-url", "", "Redis URL (default $REDIS_URL)")
	pings := fs.Int("pings", 10, "PINGs to measure latency with (1 to 1000)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on the whole command")
	if err := parse(fs, args, true); err != nil {
		return err
	}
	if fs.NArg() < 1 || fs.Arg(0) != "check" {
		return usagef("want: oncekey redis check [flags]")
	}
	if err := fs.Parse(fs.Args()[1:]); err != nil { // flags after "check"
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *pings < 1 || *pings > 1000 {
		return usagef("-pings must be 1 to 1000, got %d", *pings)
	}
	if *url == "" {
		*url = e.getenv("REDIS_URL")
	}
	if *url == "" {
		return usagef("no Redis: set -redis-url or REDIS_URL")
	}
	opt, err := redis.ParseURL(*url)
	if err != nil {
		return usagef("bad Redis URL: %v", err)
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
