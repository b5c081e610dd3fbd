package claim_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// TestClaimer_DurabilityDegraded: a pool whose sessions run with
// synchronous_commit=off makes the first claim log the setting to change
// (the check runs beside it) and set oncekey.durable.degraded; the default server (the negative
// control) logs nothing and reports 0.
func TestClaimer_DurabilityDegraded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		syncCommit string
		want       int64
	}{{"off", 1}, {"on", 0}} {
		t.Run(tc.syncCommit, func(t *testing.T) {
			sch := testenv.Postgres(t)
			cfg := poolConfig(t, sch.URL)
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = tc.syncCommit
			_, st := migratedStore(t, cfg, sch.Name)
			var buf syncBuf
			mp := newRecorder()
			c, err := claim.New[pgx.Tx](st, claim.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))), claim.WithMeterProvider(mp))
			if err != nil {
				t.Fatal(err)
			}
			mustClaim(t, c, req("k1", "v1:a"), claim.Acquired)
			// The check runs beside the claim; the pool is not configured
			// with ConfigurePool, so it always logs that when it is done.
			e := &settingsEnv{buf: &buf}
			e.waitFor(t, warnTimeouts)
			sums, err := mp.Collect(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if got, ok := sums["oncekey.durable.degraded"]; !ok || got != tc.want {
				t.Errorf("oncekey.durable.degraded = %d (reported %v), want %d", got, ok, tc.want)
			}
			logged := strings.Contains(buf.String(), "can lose acknowledged commits") &&
				strings.Contains(buf.String(), "set synchronous_commit = on")
			if logged != (tc.want == 1) {
				t.Errorf("warning logged = %v, want %v:\n%s", logged, tc.want == 1, buf.String())
			}
		})
	}
}
