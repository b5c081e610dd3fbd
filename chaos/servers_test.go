package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/chaos"
)

// unsupported is a Servers that can start nothing: every method says so
// with ErrServersUnsupported.
type unsupported struct{}

var errUnsupported = fmt.Errorf("%w: test servers", chaos.ErrServersUnsupported)

func (unsupported) Redis(context.Context) (chaos.RedisServer, error) { return nil, errUnsupported }
func (unsupported) RedisReplica(context.Context, chaos.RedisServer) (chaos.RedisServer, error) {
	return nil, errUnsupported
}
func (unsupported) Sentinel(context.Context, string, chaos.RedisServer) (chaos.SentinelServer, error) {
	return nil, errUnsupported
}
func (unsupported) Postgres(context.Context, ...string) (chaos.PostgresServer, error) {
	return nil, errUnsupported
}
func (unsupported) PostgresStandby(context.Context, chaos.PostgresServer) (chaos.PostgresStandby, error) {
	return nil, errUnsupported
}
func (unsupported) ReachLoopback() error { return errUnsupported }

// A scenario on Config.Servers whose servers cannot be started there is
// skipped, saying why, and does not fail the run; every scenario of
// Config.Servers asks it for its servers (none falls back to processes).
func TestServers_UnsupportedSkips(t *testing.T) {
	var names []string
	for _, s := range chaos.Scenarios() {
		if s.OnServers {
			names = append(names, s.Name)
		}
	}
	for _, want := range []string{"redis-restart", "redis-failover", "split-brain", "redis-sentinel", "pg-crash", "pg-failover-sync"} {
		if !slices.Contains(names, want) {
			t.Fatalf("%s is not on Config.Servers (OnServers: %v)", want, names)
		}
	}
	// The hazards are on Config.Servers too; they run only when named.
	names = append(names, "pg-crash-async-commit", "pg-failover-async")
	cfg := config(t, names...)
	cfg.Servers = unsupported{}
	rep, err := chaos.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != len(names) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(names))
	}
	for _, r := range rep.Results {
		if !strings.Contains(r.Skipped, "test servers") || r.Error != "" || r.Failed() {
			t.Errorf("%s: skipped %q, error %q, failed %v; want skipped with the servers' error", r.Scenario, r.Skipped, r.Error, r.Failed())
		}
	}
	if rep.Failed() {
		t.Error("the run failed")
	}
	if !errors.Is(errUnsupported, chaos.ErrServersUnsupported) {
		t.Fatal("errUnsupported does not match ErrServersUnsupported")
	}
}
