package chaos_test

import (
	"testing"

	"github.com/oncekey/oncekey/chaos"
)

// TestNegativeControl runs scenarios against a deliberately broken store
// and requires the checker to report violations: a checker that cannot
// fail proves nothing.
func TestNegativeControl(t *testing.T) {
	for mode, scenarios := range chaos.NegativeModes() {
		t.Run(mode, func(t *testing.T) {
			cfg, err := chaos.NegativeControl(config(t, scenarios...), mode)
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
			}
			if caught != len(scenarios) {
				t.Fatalf("the broken store %q went unnoticed in %d of %d scenarios", mode, len(scenarios)-caught, len(scenarios))
			}
		})
	}
}
