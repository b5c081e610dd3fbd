package fastpath_test

import (
	"context"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// TestFromLua checks that every field of lua.Options reaches the Options it
// stands for: a field added to lua.Options without a mapping fails here.
func TestFromLua(t *testing.T) {
	t.Parallel()
	want := fastpath.Options{
		Prefix: "p", Timeout: 2 * time.Second, MaxCachedBody: -1, CacheTTL: time.Hour,
		Breaker:    fastpath.BreakerOptions{Failures: 7, CoolDown: 3 * time.Second},
		TrustLease: time.Minute,
	}
	got := fastpath.FromLua(lua.Options{
		Prefix: "p", Timeout: 2 * time.Second, MaxCachedBody: -1, CacheTTL: time.Hour,
		BreakerFailures: 7, BreakerCoolDown: 3 * time.Second, TrustLease: time.Minute,
	})
	if got.OnStateChange != nil || got.Breaker.Now != nil {
		t.Fatal("FromLua set a hook")
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FromLua = %+v, want %+v", got, want)
	}
	zero := fastpath.FromLua(lua.Options{})
	typ := reflect.TypeFor[lua.Options]()
	for i := range typ.NumField() {
		var o lua.Options
		f := reflect.ValueOf(&o).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Int, reflect.Int64:
			f.SetInt(3)
		default:
			t.Fatalf("lua.Options.%s: kind %v not covered by this test", typ.Field(i).Name, f.Kind())
		}
		if reflect.DeepEqual(fastpath.FromLua(o), zero) {
			t.Errorf("lua.Options.%s is not mapped by FromLua", typ.Field(i).Name)
		}
	}
}

func TestNew_RejectsBadLuaOptions(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	bad := map[string]lua.Options{
		"PrefixWithBrace":  {Prefix: "a{"},
		"NegativeTimeout":  {Timeout: -1},
		"NegativeCacheTTL": {CacheTTL: -1},
		"NegativeFailures": {BreakerFailures: -1},
		"NegativeCoolDown": {BreakerCoolDown: -1},
		"NegativeTrust":    {TrustLease: -1},
	}
	for name, o := range bad {
		t.Run(name, func(t *testing.T) {
			if _, err := fastpath.New(c, fastpath.FromLua(o)); !errors.Is(err, fastpath.ErrInvalidArgument) {
				t.Fatalf("New = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

// TestDefaultsDocumented checks that lua.Options documents the defaults
// this package applies.
func TestDefaultsDocumented(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../../lua/options.go")
	if err != nil {
		t.Fatal(err)
	}
	// The comments' words, joined across lines.
	doc := strings.Join(slices.DeleteFunc(strings.Fields(string(src)), func(w string) bool { return w == "//" }), " ")
	for _, c := range []struct {
		text string
		ok   bool
	}{
		{`Defaults to "oncekey".`, fastpath.DefaultPrefix == "oncekey"},
		{"Defaults to 50ms.", fastpath.DefaultTimeout == 50*time.Millisecond},
		{"Defaults to 64 KiB;", fastpath.DefaultMaxCachedBody == 64<<10},
		{"Defaults to 24h.", fastpath.DefaultCacheTTL == 24*time.Hour},
		{"Defaults to 5.", fastpath.DefaultBreakerFailures == 5},
		{"Defaults to 1s.", fastpath.DefaultBreakerCoolDown == time.Second},
	} {
		if !strings.Contains(doc, c.text) || !c.ok {
			t.Errorf("lua.Options says %q: in the doc %v, matches the constant %v", c.text, strings.Contains(doc, c.text), c.ok)
		}
	}
}

// TestWithHooks checks that hooks attached to a client reach the breaker:
// its clock, and a state callback called after the Options' own.
func TestWithHooks(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	clk := newFakeClock()
	var order []string
	first, extra := &stateLog{}, &stateLog{}
	s, err := fastpath.New(fastpath.WithHooks(c, fastpath.Hooks{
		Now: clk.Now,
		OnStateChange: func(st fastpath.BreakerState) {
			order = append(order, "hook")
			extra.record(st)
		},
	}), fastpath.Options{
		Timeout: time.Second,
		Breaker: fastpath.BreakerOptions{Failures: 1, CoolDown: time.Hour},
		OnStateChange: func(st fastpath.BreakerState) {
			order = append(order, "options")
			first.record(st)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	claim := func() error {
		_, err := s.Claim(context.Background(), refFor(t, "k"), fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
		return err
	}
	if err := claim(); !errors.Is(err, fastpath.ErrUnavailable) || errors.Is(err, fastpath.ErrBreakerOpen) {
		t.Fatalf("first claim = %v, want a failed call", err)
	}
	if err := claim(); !errors.Is(err, fastpath.ErrBreakerOpen) {
		t.Fatalf("second claim = %v, want ErrBreakerOpen", err)
	}
	// Only the hooked clock can end an hour's cool-down now.
	clk.Advance(time.Hour)
	if err := claim(); errors.Is(err, fastpath.ErrBreakerOpen) || !errors.Is(err, fastpath.ErrUnavailable) {
		t.Fatalf("claim after the hooked clock's cool-down = %v, want a failed probe", err)
	}
	want := []fastpath.BreakerState{fastpath.BreakerOpen, fastpath.BreakerHalfOpen, fastpath.BreakerOpen}
	if got := first.get(); !slices.Equal(got, want) {
		t.Errorf("Options.OnStateChange saw %v, want %v", got, want)
	}
	if got := extra.get(); !slices.Equal(got, want) {
		t.Errorf("Hooks.OnStateChange saw %v, want %v", got, want)
	}
	if want := []string{"options", "hook", "options", "hook", "options", "hook"}; !slices.Equal(order, want) {
		t.Errorf("callbacks ran in order %v, want %v", order, want)
	}
}

func TestEvictionPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redisproc.Start(t, redisproc.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	for name, client := range map[string]redis.Scripter{"Client": c, "HookedClient": fastpath.WithHooks(c, fastpath.Hooks{})} {
		t.Run(name, func(t *testing.T) {
			s, err := fastpath.New(client, fastpath.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if p, err := s.EvictionPolicy(ctx); err != nil || p != "allkeys-lru" {
				t.Fatalf("EvictionPolicy = %q, %v; want allkeys-lru", p, err)
			}
		})
	}
	t.Run("NotAUniversalClient", func(t *testing.T) {
		s, err := fastpath.New(&countingScripter{Scripter: c}, fastpath.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if p, err := s.EvictionPolicy(ctx); err != nil || p != "" {
			t.Fatalf("EvictionPolicy = %q, %v; want no policy and no error", p, err)
		}
	})
}

func TestErrUnavailableMatchesDurable(t *testing.T) {
	t.Parallel()
	for _, err := range []error{fastpath.ErrUnavailable, fastpath.ErrBreakerOpen, fastpath.ErrCorrupt} {
		if !errors.Is(err, durable.ErrUnavailable) || !errors.Is(err, fastpath.ErrUnavailable) {
			t.Errorf("%v does not match durable.ErrUnavailable and fastpath.ErrUnavailable", err)
		}
	}
	for _, err := range []error{fastpath.ErrInvalidArgument, fastpath.ErrPolicyUnknown} {
		if errors.Is(err, durable.ErrUnavailable) {
			t.Errorf("%v matches durable.ErrUnavailable", err)
		}
	}
	if errors.Is(durable.ErrUnavailable, fastpath.ErrUnavailable) {
		t.Error("durable.ErrUnavailable matches fastpath.ErrUnavailable")
	}
	if got := fastpath.ErrUnavailable.Error(); got != "fastpath: redis unavailable" {
		t.Errorf("ErrUnavailable = %q", got)
	}
}
