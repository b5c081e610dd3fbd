package check_test

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/fence"
)

// A worker paused past its lease; another took over and completed; the
// first one's completion was then accepted anyway (a store without the
// fence). The checker names what broke.
func ExampleCheck() {
	a := fence.Token{Generation: 1, Owner: uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000001")}
	b := fence.Token{Generation: 2, Owner: uuid.MustParse("bbbbbbbb-0000-4000-8000-000000000002")}
	resultA, resultB := history.Hash([]byte("A")), history.Hash([]byte("B"))
	at := func(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }
	in := check.Input{
		Calls: []history.Call{
			{Key: "orders/1", Epoch: 1, Client: 0, Kind: history.Acquire, Token: a, Fingerprint: "fp", Start: at(0), End: at(5)},
			{Key: "orders/1", Epoch: 1, Client: 1, Kind: history.Acquire, Token: b, Fingerprint: "fp", Start: at(400), End: at(405)},
			{Key: "orders/1", Epoch: 1, Client: 1, Kind: history.Complete, Token: b, Body: resultB, Status: 201, Start: at(410), End: at(415)},
			{Key: "orders/1", Epoch: 1, Client: 0, Kind: history.Complete, Token: a, Body: resultA, Status: 201, Start: at(900), End: at(905)},
		},
		Effects: []history.Effect{{Key: "orders/1", Epoch: 1, Owner: b.Owner, Generation: 2, Body: resultB}},
		Records: []history.Record{{Key: "orders/1", State: "completed", Generation: 2, Owner: b.Owner, Body: resultA, Status: 201}},
	}
	r := check.Check(in, check.Options{})
	for _, v := range r.Violations {
		fmt.Println(v.Invariant)
	}
	// Output:
	// replays-identical
	// no-stale-completion
	// linearizable
	// acked-result-durable
}
