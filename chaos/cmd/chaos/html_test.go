package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/chaos"
	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/fence"
)

// TestWriteHTML: from a report and the calls the checker observed, the
// summary lists the scenarios, their faults and violations, and links the
// operation with calls to its page; a violation without an operation is
// listed without one.
func TestWriteHTML(t *testing.T) {
	a := fence.Token{Generation: 1, Owner: uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000001")}
	b := fence.Token{Generation: 2, Owner: uuid.MustParse("bbbbbbbb-0000-4000-8000-000000000002")}
	calls := []history.Call{
		{Key: "stale-owner/1", Epoch: 1, Client: 0, Kind: history.Acquire, Token: a, Fingerprint: "fp", Start: 0, End: 5},
		{Key: "stale-owner/1", Epoch: 1, Client: 1, Kind: history.Acquire, Token: b, Fingerprint: "fp", Start: 400, End: 405},
		{Key: "stale-owner/1", Epoch: 1, Client: 0, Kind: history.Complete, Token: a, Body: "aa", Start: 900, End: 905},
		{Key: "stale-owner/2", Epoch: 1, Client: 0, Kind: history.Acquire, Token: a, Fingerprint: "fp", Start: 0, End: 5},
	}
	viol := check.Violation{Invariant: check.Linearizable, Op: "stale-owner/1#1", Detail: "no sequential execution"}
	h := newHistories()
	h.observe(check.Input{Calls: calls}, check.Report{Violations: []check.Violation{viol}})
	rep := chaos.Report{Seed: 7, Results: []chaos.Result{
		{Scenario: "stale-owner", Faults: map[string]int64{"pause": 3, "cut": 0}, FaultsTotal: 3,
			Violations: []chaos.Violation{chaos.Violation(viol), {Invariant: check.OneOwnerPerGeneration, Detail: "downstream: gen 2 by two owners"}},
			Timeline:   []chaos.FaultSpan{{Kind: "postgres-failover", Start: 100, End: 500}, {Kind: "redis-flushed", Start: 2000, End: 2100}},
			Repeated:   &chaos.Repeated{Fault: "pause", Fired: 3, Required: 2}},
		{Scenario: "mismatch", Faults: map[string]int64{"mismatch": 2}, FaultsTotal: 2},
	}, Violations: 2}
	dir := t.TempDir()
	pages, err := writeHTML(dir, rep, h, "")
	if err != nil || pages != 1 {
		t.Fatalf("pages %d, err %v; want 1 page", pages, err)
	}
	index, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"stale-owner", "mismatch", "pause: 3", "never fired: cut", check.Linearizable, check.OneOwnerPerGeneration,
		`<a href="stale-owner_1_1.html">stale-owner/1#1</a>`, "not linearizable", "downstream: gen 2 by two owners",
		"<svg", "postgres-failover at 0s for 0s", "redis-flushed", "pause 3 times (2 required)"} {
		if !strings.Contains(string(index), want) {
			t.Errorf("index.html lacks %q", want)
		}
	}
	page, err := os.ReadFile(filepath.Join(dir, "stale-owner_1_1.html"))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(page); !strings.Contains(s, "stale-owner/1#1") || !strings.Contains(s, check.Linearizable) || strings.Contains(s, "stale-owner/2") {
		t.Fatalf("the page does not name its operation and invariant alone:\n%.2000s", s)
	}
	// Above the operation's calls, the faults in place while they ran:
	// the failover (100-500ns, within its calls' 0-905ns), not the flush
	// (2000ns).
	s := string(page)
	during := s[strings.Index(s, "Faults while its calls ran"):]
	during = during[:strings.Index(during, "</ul>")]
	if !strings.Contains(during, "<li>postgres-failover at") || strings.Contains(during, "<li>redis-flushed") {
		t.Fatalf("the page's faults during the operation are not the failover alone:\n%s", during)
	}
}
