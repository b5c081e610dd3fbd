package chaos_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/chaos"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// negativeCatch names, for the modes that have one, the violation that
// shows the bug itself was caught, not only one of its consequences:
// under expires-in-inflated, a replay-cache retry answered by its process
// cache with the result of the key's previous life (the entry outlived its
// record); under retry-takes-lease, a retry of a finished operation told
// "in progress" (the lease another retry took only to replay); under
// do-skips-lock, a duplicate's run of Do's function beside the first one's
// (its writes rolled back, nothing else shows).
var negativeCatch = map[string]struct{ invariant, detail string }{
	"expires-in-inflated": {"no-replay-of-an-expired-life", "from the process cache"},
	"retry-takes-lease":   {"finished-never-in-progress", "answered in_progress"},
	"do-skips-lock":       {"one-fn-run-at-a-time", "started while another ran"},
	"trust-lease":         {"finished-never-in-progress", "answered in_progress"},
}

// TestNegativeControl runs scenarios against a deliberately broken store
// and requires the checker to report violations: a checker that cannot
// fail proves nothing. The modes that break the settlement engine need
// -tags oncekey_negative: without it they fail under CI=true and skip
// otherwise.
func TestNegativeControl(t *testing.T) {
	for mode, scenarios := range chaos.NegativeModes() {
		t.Run(mode, func(t *testing.T) {
			cfg, err := chaos.NegativeControl(config(t, scenarios...), mode)
			if errors.Is(err, chaos.ErrNotBuilt) {
				settletest.NotBuilt(t, "the negative control "+mode)
			}
			if err != nil {
				t.Fatal(err)
			}
			rep, err := chaos.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			caught := 0
			for _, r := range rep.Results {
				if r.Error != "" {
					t.Errorf("%s: %s", r.Scenario, r.Error)
				}
				kinds := map[string]int{}
				for _, v := range r.Violations {
					kinds[v.Invariant]++
				}
				t.Logf("%s under %s: %d violations %v", r.Scenario, mode, len(r.Violations), kinds)
				if len(r.Violations) > 0 {
					caught++
				}
				if want, ok := negativeCatch[mode]; ok {
					found := false
					for _, v := range r.Violations {
						if v.Invariant == want.invariant && strings.Contains(v.Detail, want.detail) {
							t.Logf("caught: %s", v)
							found = true
							break
						}
					}
					if !found {
						t.Errorf("%s under %s: no %s violation %q among %v", r.Scenario, mode, want.invariant, want.detail, kinds)
					}
				}
			}
			if caught != len(scenarios) {
				t.Fatalf("the broken store %q went unnoticed in %d of %d scenarios", mode, len(scenarios)-caught, len(scenarios))
			}
		})
	}
}
