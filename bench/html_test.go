package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWriteHTML: from a small synthetic result set, -html writes one page
// with an inline SVG per closed-loop workload, open-loop run and knee
// sweep, naming every variant, and fetching nothing.
func TestWriteHTML(t *testing.T) {
	t.Parallel()
	rep := newReport(config{})
	rep.Workloads = []workloadReport{
		{Name: "fresh", About: "unique keys", Variants: []variantReport{
			{Name: "library", P50us: 900, P99us: 4000, P999us: 12000},
			{Name: "library-no-redis", P50us: 800, P99us: 3500, P999us: 9000},
			{Name: "floor-sql", Floor: true, P50us: 500, P99us: 2000, P999us: 5000},
		}},
		{Name: "redis-down", Variants: []variantReport{
			{Name: "breaker-open", P50us: 700, P99us: 2500, P999us: 7000},
			{Name: "no-successes"}, // no latency: no points, no panic on the log axis
		}},
	}
	rep.OpenLoop = []openWorkloadReport{{Name: "replay", Rate: 1000, Variants: []openVariantReport{
		{Name: "library", P50us: 300, P99us: 1500, P999us: 3000},
		{Name: "floor-evalsha", Floor: true, P50us: 200, P99us: 900, P999us: 2000},
	}}}
	rep.Knee = []kneeWorkloadReport{{Name: "fresh", P99BoundUs: 50000, StepSeconds: 2, Rates: []float64{250, 500, 1000}, Variants: []kneeVariantReport{
		{Name: "library", Knee: 500, FirstOver: 1000, Steps: []kneeStep{
			{Rate: 250, Achieved: 249, P99us: 10000}, {Rate: 500, Achieved: 498, P99us: 30000}, {Rate: 1000, Achieved: 700, P99us: 90000, Exceeded: true}}},
		{Name: "floor-business-tx", Floor: true, Knee: 1000, Steps: []kneeStep{
			{Rate: 250, Achieved: 250, P99us: 5000}, {Rate: 500, Achieved: 500, P99us: 6000}, {Rate: 1000, Achieved: 990, P99us: 8000}}},
	}}}
	rep.Seconds = (3 * time.Second).Seconds()
	path := filepath.Join(t.TempDir(), "bench.html")
	if err := writeHTML(path, rep); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	if n := strings.Count(page, "<svg"); n != 4 {
		t.Errorf("%d <svg> elements, want 4 (fresh, redis-down, replay open loop, fresh knee)", n)
	}
	for _, want := range []string{
		"fresh (closed loop)", "redis-down (closed loop)", "replay (open loop at 1000/s)", "fresh knee (open loop)",
		"library", "library-no-redis", "floor-sql (floor)", "breaker-open", "no-successes", "floor-evalsha (floor)",
		"library: knee 500/s", "floor-business-tx (floor): knee ≥ 1000/s", "p99 bound 50ms", "p50", "p99.9",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://", "<?xml"} {
		if bad == "http://" {
			// The SVG namespaces are names, not fetches.
			page = strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, "")
			page = strings.ReplaceAll(page, `xmlns:xlink="http://www.w3.org/1999/xlink"`, "")
		}
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %q: it must be self-contained", bad)
		}
	}
}

// TestWriteHTML_Empty: a run without results still writes the page.
func TestWriteHTML_Empty(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bench.html")
	if err := writeHTML(path, newReport(config{})); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), "nothing to plot") {
		t.Fatalf("page %q, err %v", b, err)
	}
}

// TestWriteHTML_KneeWithoutPoints: a knee sweep whose steps have no
// latency (every request failed) still draws, on empty log axes.
func TestWriteHTML_KneeWithoutPoints(t *testing.T) {
	t.Parallel()
	rep := newReport(config{})
	rep.Knee = []kneeWorkloadReport{{Name: "replay", P99BoundUs: 50000, Variants: []kneeVariantReport{{Name: "library", Steps: []kneeStep{{Rate: 250, Exceeded: true}}}}}}
	path := filepath.Join(t.TempDir(), "bench.html")
	if err := writeHTML(path, rep); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || strings.Count(string(b), "<svg") != 1 {
		t.Fatalf("err %v; want one <svg>", err)
	}
}
