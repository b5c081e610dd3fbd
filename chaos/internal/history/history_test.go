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
