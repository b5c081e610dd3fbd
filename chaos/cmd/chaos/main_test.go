package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/chaos"
	"github.com/oncekey/oncekey/internal/testenv"
)

func TestRun_ListAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"-list"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "split-brain") {
		t.Fatalf("-list: exit %d, output %q", code, out.String())
	}
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	if code := run(nil, &out, &errb); code != 2 {
		t.Fatalf("no addresses: exit %d, want 2", code)
	}
	if code := run([]string{"-redis", "redis://x", "-postgres", "postgres://x", "-scenario", "nope"}, &out, &errb); code != 2 {
		t.Fatalf("unknown scenario: exit %d, want 2", code)
	}
}

func TestRun_TableAndJSON(t *testing.T) {
	file := filepath.Join(t.TempDir(), "report.json")
	var out, errb bytes.Buffer
	code := run([]string{"-redis", testenv.RedisURL(t), "-postgres", testenv.DatabaseURL(t),
		"-scenario", "mismatch,crash-before-commit", "-iterations", "4", "-seed", "3", "-json", file}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"chaos: mismatch", "scenario", "faults injected", "crash-before-commit", "no violations"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rep chaos.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Seed != 3 || len(rep.Results) != 2 || rep.Results[0].FaultsTotal == 0 {
		t.Fatalf("report = %+v", rep)
	}
}

func TestRun_NegativeControlIsCaught(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-redis", testenv.RedisURL(t), "-postgres", testenv.DatabaseURL(t),
		"-negative", "complete-without-fence", "-scenario", "paused-owner", "-iterations", "8"}, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "caught the broken store") {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
}

// TestRun_BrokenSettlementIsCaught runs a negative control of the
// settlement engine (broken for the whole process, not the store) through
// the flag: the entry-point scenario must catch it. 24 operations give
// the short finish outage, the window that reveals it, three chances (8
// gave one, and a loaded machine once let it pass).
func TestRun_BrokenSettlementIsCaught(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-redis", testenv.RedisURL(t), "-postgres", testenv.DatabaseURL(t),
		"-negative", "one-attempt", "-scenario", "grpc-windows", "-iterations", "24"}, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "caught the broken store") {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
}
