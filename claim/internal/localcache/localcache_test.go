package localcache

import (
	"crypto/sha256"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/oncekey/oncekey/durable"
)

func key(i int) [32]byte { return sha256.Sum256([]byte(fmt.Sprint(i))) }

func result(body string) durable.Result {
	return durable.Result{StatusCode: 201, Body: []byte(body), Headers: map[string][]string{"Content-Type": {"application/json"}}, Version: 1, ResourceID: "r1"}
}

func TestGet_AnswersTheStoredFingerprintUntilTheDeadline(t *testing.T) {
	c := New(1 << 20)
	now := time.Now()
	c.Put(key(1), "fp", durable.Completed, result(`{"a":1}`), now.Add(time.Second), now)

	state, res, ok := c.Get(key(1), "fp", now.Add(999*time.Millisecond))
	if !ok || state != durable.Completed || string(res.Body) != `{"a":1}` || res.StatusCode != 201 || res.ResourceID != "r1" || res.Version != 1 || res.Headers["Content-Type"][0] != "application/json" {
		t.Fatalf("Get before the deadline = %v %+v %v, want the stored result", state, res, ok)
	}
	if _, _, ok := c.Get(key(1), "other", now); ok {
		t.Fatal("Get with another fingerprint answered; it must go on to the stores")
	}
	if _, _, ok := c.Get(key(2), "fp", now); ok {
		t.Fatal("Get of another key answered")
	}
	if _, _, ok := c.Get(key(1), "fp", now.Add(time.Second)); ok {
		t.Fatal("Get at the deadline answered; the record may be gone")
	}
	if c.Len() != 0 || c.Bytes() != 0 {
		t.Fatalf("after an expired Get: %d entries, %d bytes; want it dropped", c.Len(), c.Bytes())
	}
}

func TestPut_KeepsOnlyFinishedResultsWithTimeLeft(t *testing.T) {
	c := New(1 << 20)
	now := time.Now()
	for _, st := range []durable.State{durable.Processing, durable.Uncertain, ""} {
		c.Put(key(1), "fp", st, result("x"), now.Add(time.Hour), now)
	}
	c.Put(key(2), "fp", durable.Completed, result("x"), now, now)                   // no time left
	c.Put(key(3), "fp", durable.Completed, result("x"), now.Add(-time.Second), now) // expired
	if c.Len() != 0 {
		t.Fatalf("%d entries kept; want none (unfinished states, no time left)", c.Len())
	}
	c.Put(key(4), "fp", durable.Failed, result("x"), now.Add(time.Hour), now)
	if st, _, ok := c.Get(key(4), "fp", now); !ok || st != durable.Failed {
		t.Fatalf("a failed result: %v %v, want it kept (it replays like a completed one)", st, ok)
	}
}

func TestGet_ReturnsACopy(t *testing.T) {
	c := New(1 << 20)
	now := time.Now()
	in := result("abc")
	c.Put(key(1), "fp", durable.Completed, in, now.Add(time.Hour), now)
	in.Body[0] = 'X'
	in.Headers["Content-Type"][0] = "changed"

	_, a, _ := c.Get(key(1), "fp", now)
	a.Body[0] = 'Y'
	a.Headers["Content-Type"][0] = "changed too"
	a.Headers["New"] = []string{"v"}

	_, b, _ := c.Get(key(1), "fp", now)
	if string(b.Body) != "abc" || b.Headers["Content-Type"][0] != "application/json" || len(b.Headers) != 1 {
		t.Fatalf("cached result changed through a caller's copy: %q %v", b.Body, b.Headers)
	}
}

func TestPut_EvictsTheLeastRecentlyUsed(t *testing.T) {
	body := make([]byte, 1000)
	per := Cost("fp", durable.Result{Body: body})
	// Three entries fit in each shard's budget.
	c := New(3 * per * shards)
	now := time.Now()
	// Keys of one shard.
	var ks [][32]byte
	for i := 0; len(ks) < 4; i++ {
		if k := key(i); k[0]%shards == 0 {
			ks = append(ks, k)
		}
	}
	for _, k := range ks[:3] {
		c.Put(k, "fp", durable.Completed, durable.Result{Body: body}, now.Add(time.Hour), now)
	}
	c.Get(ks[0], "fp", now) // ks[1] is now the least recently used
	c.Put(ks[3], "fp", durable.Completed, durable.Result{Body: body}, now.Add(time.Hour), now)
	for i, want := range []bool{true, false, true, true} {
		if _, _, ok := c.Get(ks[i], "fp", now); ok != want {
			t.Errorf("entry %d kept = %v, want %v", i, ok, want)
		}
	}
	if got := c.Bytes(); got != 3*per {
		t.Errorf("Bytes = %d, want %d", got, 3*per)
	}
	// An entry over a shard's budget is not kept, and evicts nothing.
	c.Put(key(99), "fp", durable.Completed, durable.Result{Body: make([]byte, 4*per)}, now.Add(time.Hour), now)
	if c.Len() != 3 {
		t.Errorf("after an oversized Put: %d entries, want 3", c.Len())
	}
}

func TestPut_ReplacesAnEntry(t *testing.T) {
	c := New(1 << 20)
	now := time.Now()
	c.Put(key(1), "fp", durable.Completed, result("old"), now.Add(time.Hour), now)
	c.Put(key(1), "fp", durable.Completed, result("new"), now.Add(time.Minute), now)
	_, res, ok := c.Get(key(1), "fp", now)
	if !ok || string(res.Body) != "new" || c.Len() != 1 || c.Bytes() != Cost("fp", result("new")) {
		t.Fatalf("after a second Put: %q %v, %d entries, %d bytes", res.Body, ok, c.Len(), c.Bytes())
	}
	if _, _, ok := c.Get(key(1), "fp", now.Add(time.Minute)); ok {
		t.Fatal("the second Put's deadline was not applied")
	}
}

func TestNew_OffWhenNotPositive(t *testing.T) {
	if New(0) != nil || New(-1) != nil {
		t.Fatal("New(0) or New(-1) returned a cache")
	}
}

func TestCache_Concurrent(t *testing.T) {
	c := New(1 << 16)
	now := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				k := key(i % 300)
				c.Put(k, "fp", durable.Completed, result(fmt.Sprint(i%300)), now.Add(time.Hour), now)
				if _, res, ok := c.Get(k, "fp", now); ok && string(res.Body) != fmt.Sprint(i%300) {
					t.Errorf("key %d answered %q", i%300, res.Body)
					return
				}
			}
		}()
	}
	wg.Wait()
	if c.Bytes() > 1<<16 {
		t.Fatalf("Bytes = %d, over the budget %d", c.Bytes(), 1<<16)
	}
}

// TestEntryOverhead measures the heap an entry takes, for results of a few
// shapes, and fails when Cost counts less: the budget must bound the
// memory it claims to.
func TestEntryOverhead(t *testing.T) {
	hdr := func(n int) map[string][]string {
		h := map[string][]string{}
		for i := range n {
			h[fmt.Sprintf("X-Header-%d", i)] = []string{"value"}
		}
		return h
	}
	for _, tc := range []struct {
		name string
		res  durable.Result
	}{
		{"empty body, no headers", durable.Result{StatusCode: 204, Body: []byte{}}},
		{"100-byte body, 1 header", durable.Result{StatusCode: 200, Body: make([]byte, 100), Headers: hdr(1)}},
		{"1 KiB body, 7 headers", durable.Result{StatusCode: 200, Body: make([]byte, 1024), Headers: hdr(7), ResourceID: "ord_123"}},
		{"100-byte body, 9 headers", durable.Result{StatusCode: 200, Body: make([]byte, 100), Headers: hdr(9)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 20000
			c := New(1 << 40)
			now := time.Now()
			keys := make([][32]byte, n)
			fps := make([]string, n)
			for i := range keys {
				keys[i] = key(i)
				fps[i] = fmt.Sprintf("%064d", i) // a hex SHA-256's length
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i, k := range keys {
				c.Put(k, fps[i], durable.Completed, tc.res, now.Add(time.Hour), now)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			// The fingerprints were allocated before: add what Cost counts
			// for them, as a cache holding the only reference would.
			perEntry := float64(after.HeapAlloc-before.HeapAlloc)/n + float64(len(fps[0]))
			counted := float64(Cost(fps[0], tc.res))
			t.Logf("heap per entry %.0f bytes; Cost counts %.0f", perEntry, counted)
			if perEntry > counted {
				t.Errorf("an entry takes %.0f bytes of heap, Cost counts %.0f: raise EntryOverhead or HeadersOverhead", perEntry, counted)
			}
			runtime.KeepAlive(c)
		})
	}
}
