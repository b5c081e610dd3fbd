package fastpath_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// The fast path around one operation: claim, (durable claim and the
// handler, not shown), complete, and a retry answered from the cache.
func Example() {
	c, prefix, cleanup := testenv.ExampleRedis() // any Redis: standalone, Sentinel or Cluster
	defer cleanup()
	s, err := fastpath.New(c, fastpath.Options{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	ref := durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "7d3f-{user}"}.Ref(nil)
	fmt.Println(strings.TrimPrefix(s.Keys(ref).Record, prefix)[:10] + "...}:rec")

	owner := uuid.New()
	r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: "v1:abc", Owner: owner, Lease: 30 * time.Second})
	if errors.Is(err, fastpath.ErrUnavailable) {
		// Redis is down or the breaker is open: claim in the durable store
		// alone, with proposed generation 0.
		fmt.Println("durable store only:", err)
		return
	}
	// The proposal is Redis's clock in ms - 59s: about the time in ms, as
	// the durable store would choose.
	fmt.Println(r.Status, r.Generation > 1_000_000_000_000)

	// The durable claim ran with Proposed = r.Generation and returned the
	// token; the handler ran; the durable store committed the result.
	tok := fence.Token{Generation: r.Generation, Owner: owner}
	res := durable.Result{StatusCode: 201, Headers: map[string][]string{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}
	cached, _ := s.Complete(ctx, ref, tok, "v1:abc", durable.Completed, res, 24*time.Hour)
	fmt.Println("cached:", cached)

	retry, _ := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: "v1:abc", Owner: uuid.New(), Lease: 30 * time.Second})
	fmt.Println(retry.Status, retry.Cached.Result.StatusCode, string(retry.Cached.Result.Body))

	other, _ := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: "v1:other", Owner: uuid.New(), Lease: 30 * time.Second})
	fmt.Println(other.Status)
	// Output:
	// :{1e7268a2...}:rec
	// acquired true
	// cached: true
	// cached 201 {"id":1}
	// mismatch
}
