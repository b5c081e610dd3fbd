package history_test

import (
	"sync"
	"testing"

	"github.com/oncekey/oncekey/chaos/internal/history"
)

func TestRecorder(t *testing.T) {
	r := history.NewRecorder()
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Go(func() {
			kind := history.Replay
			if i%2 == 0 {
				kind = history.NoEffect
			}
			start := r.Now()
			r.Add(history.Call{Key: "s/1", Epoch: 1, Client: i, Kind: kind, Start: start, End: r.Now()})
		})
	}
	wg.Wait()
	calls := r.Calls()
	if len(calls) != 10 {
		t.Fatalf("%d calls, want 10", len(calls))
	}
	ids := map[int]bool{}
	for _, c := range calls {
		if c.End < c.Start || ids[c.ID] || c.Op() != "s/1#1" {
			t.Fatalf("bad call %+v", c)
		}
		ids[c.ID] = true
	}
	if n := r.Counts(); n[history.Replay] != 5 || n[history.NoEffect] != 5 {
		t.Fatalf("counts = %v", n)
	}
}

func TestRecorder_Runs(t *testing.T) {
	r := history.NewRecorder()
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Go(func() {
			start := r.Now()
			r.AddRun(history.Run{Key: "s/1", Epoch: 2, Client: i, Locked: i%2 == 0, Start: start, End: r.Now(), Effect: int64(i)})
		})
	}
	wg.Wait()
	runs := r.Runs()
	if len(runs) != 10 || len(r.Calls()) != 0 {
		t.Fatalf("%d runs and %d calls, want 10 and 0", len(runs), len(r.Calls()))
	}
	for _, x := range runs {
		if x.End < x.Start || x.Op() != "s/1#2" || x.Locked != (x.Client%2 == 0) {
			t.Fatalf("bad run %+v", x)
		}
	}
}

func TestHash(t *testing.T) {
	if history.Hash([]byte("a")) == history.Hash([]byte("b")) || len(history.Hash(nil)) != 64 {
		t.Fatal("Hash does not tell bodies apart or is not hex SHA-256")
	}
}

func TestNewTables_RejectsBadSchema(t *testing.T) {
	if _, err := history.NewTables("x; DROP"); err == nil {
		t.Fatal("NewTables accepted a schema that is not an identifier")
	}
}
