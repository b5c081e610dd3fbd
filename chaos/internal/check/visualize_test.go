package check_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/fence"
)

// TestVisualize_StaleCompletion: porcupine's page of a history no
// sequential execution explains says so, names the operation, its calls,
// the record's states and the violation noted on it.
func TestVisualize_StaleCompletion(t *testing.T) {
	calls := []history.Call{
		call(history.Acquire, 0, tok(1, ownerA), "", 0, 5),
		call(history.Acquire, 1, tok(2, ownerB), "", 400, 405),
		call(history.Complete, 1, tok(2, ownerB), bodyB, 410, 415),
		call(history.Complete, 0, tok(1, ownerA), bodyA, 900, 905),
		call(history.NoEffect, 2, fence.Token{}, "", 920, 925),
	}
	var page bytes.Buffer
	verdict, err := check.Visualize(&page, calls, []check.Violation{{Invariant: check.NoStaleCompletion, Op: "k#1", Detail: "completion under generation 1"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if verdict != check.VerdictNotLinearizable {
		t.Fatalf("verdict %q, want %q", verdict, check.VerdictNotLinearizable)
	}
	for _, want := range []string{"<html", "k#1", "complete gen=1", "gen 2 owner bbbbbbbb", check.NoStaleCompletion, "completion under generation 1", "k#1 none"} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

func TestVisualize_GoodHistory(t *testing.T) {
	var page bytes.Buffer
	verdict, err := check.Visualize(&page, good().Calls, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if verdict != check.VerdictLinearizable || !strings.Contains(page.String(), "done by gen 2") {
		t.Fatalf("verdict %q; page has the final state: %v", verdict, strings.Contains(page.String(), "done by gen 2"))
	}
}

// TestSetObserver: every Check hands its input and report to the observer
// until it is restored.
func TestSetObserver(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []check.Report
	)
	restore := check.SetObserver(func(in check.Input, r check.Report) {
		mu.Lock()
		defer mu.Unlock()
		if len(in.Calls) == 0 {
			t.Error("the observer got no calls")
		}
		seen = append(seen, r)
	})
	in := good()
	in.Effects = append(in.Effects, in.Effects[0])
	check.Check(in, check.Options{})
	restore()
	check.Check(in, check.Options{})
	if len(seen) != 1 || seen[0].OK() || seen[0].Violations[0].Invariant != check.AtMostOneEffect {
		t.Fatalf("observed %+v, want one report with %s", seen, check.AtMostOneEffect)
	}
}
