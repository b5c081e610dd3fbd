package claim_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// failHook makes every command of its client fail while down is set, as a
// Redis that stopped answering would.
type failHook struct{ down *atomic.Bool }

var errRedisDown = errors.New("test: redis down")

func (h failHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h failHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.down.Load() {
			cmd.SetErr(errRedisDown)
			return errRedisDown
		}
		return next(ctx, cmd)
	}
}
func (h failHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.down.Load() {
			return errRedisDown
		}
		return next(ctx, cmds)
	}
}

// TestClaimer_BreakerWarnsRateLimited: the Redis breaker's opening and
// closing are WARN lines saying where claims go, at most one opening line
// per 10s (by the warnings' clock, driven here) and one closing line per
// opening line; an opening in between is not logged but counted on the
// next opening line, and every opening is counted in
// oncekey.redis.breaker.opens. The last line always ends up telling the
// state: an opening not logged is logged at the first change past the 10s.
func TestClaimer_BreakerWarnsRateLimited(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed)
	rdb, prefix := testenv.Redis(t)
	var down atomic.Bool
	flaky := redis.NewClient(rdb.Options())
	flaky.AddHook(failHook{&down})
	t.Cleanup(func() { flaky.Close() })
	var buf syncBuf
	mp := newRecorder()
	const coolDown = 20 * time.Millisecond
	c, err := claim.New[pgx.Tx](e.store,
		claim.WithRedis(flaky, lua.Options{Prefix: prefix, Timeout: time.Second, BreakerFailures: 1, BreakerCoolDown: coolDown}),
		claim.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))), claim.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	claim.SetBreakerLogClock(c, func() time.Time { return time.Unix(0, clock.Load()) })

	n := 0
	claimOne := func() {
		t.Helper()
		n++
		mustClaim(t, c, req("breaker-"+string(rune('a'+n)), "v1:a"), claim.Acquired)
	}
	// open makes one Redis call fail (the breaker opens, the claim goes to
	// the database alone); closeAfter lets a probe through after the
	// cool-down, which succeeds.
	open := func() {
		t.Helper()
		down.Store(true)
		claimOne()
	}
	closeAfter := func() {
		t.Helper()
		down.Store(false)
		time.Sleep(2 * coolDown)
		claimOne()
	}
	const opened, closed = `msg="oncekey: redis breaker" state=open`, `msg="oncekey: redis breaker" state=closed`
	lines := func(msg string) []string {
		var out []string
		for _, l := range strings.Split(buf.String(), "\n") {
			if strings.Contains(l, msg) {
				out = append(out, l)
			}
		}
		return out
	}
	check := func(wantOpens int64, wantOpened, wantClosed int) {
		t.Helper()
		sums, err := mp.Collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := sums["oncekey.redis.breaker.opens"]; got != wantOpens {
			t.Fatalf("oncekey.redis.breaker.opens = %d, want %d", got, wantOpens)
		}
		if got := lines(opened); len(got) != wantOpened {
			t.Fatalf("%d opening lines, want %d:\n%s", len(got), wantOpened, buf.String())
		}
		if got := lines(closed); len(got) != wantClosed {
			t.Fatalf("%d closing lines, want %d:\n%s", len(got), wantClosed, buf.String())
		}
	}

	open()
	check(1, 1, 0)
	first := lines(opened)[0]
	for _, want := range []string{"level=WARN", "durable store alone"} {
		if !strings.Contains(first, want) {
			t.Fatalf("opening line lacks %q: %s", want, first)
		}
	}
	closeAfter()
	check(1, 1, 1)
	if l := lines(closed)[0]; !strings.Contains(l, "level=WARN") || !strings.Contains(l, "use Redis again") {
		t.Fatalf("closing line: %s", l)
	}

	// Within 10s: counted, not logged, and so neither is its closing.
	open()
	closeAfter()
	check(2, 1, 1)

	// 10s later by the warnings' clock: logged again, with the count of
	// the opening in between.
	clock.Add(int64(11 * time.Second))
	open()
	check(3, 2, 1)
	if l := lines(opened)[1]; !strings.Contains(l, "suppressed=1") {
		t.Fatalf("second opening line does not count the one not logged: %s", l)
	}
	closeAfter()
	check(3, 2, 2)

	// An opening not logged, and Redis stays down: the log catches up at
	// the first change past the 10s (a failed probe), so its last line
	// says open.
	open()
	check(4, 2, 2)
	clock.Add(int64(11 * time.Second))
	time.Sleep(2 * coolDown)
	claimOne() // the probe fails
	check(4, 3, 2)
	all := lines(`msg="oncekey: redis breaker" `)
	if last := all[len(all)-1]; !strings.Contains(last, "state=open") {
		t.Fatalf("last breaker line %q, want state=open", last)
	}
}
