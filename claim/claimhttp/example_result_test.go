package claimhttp_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
)

// A claim.Reconciler's resolve function settles an uncertain POST /charges
// after asking the payment provider, which declined it: it stores the
// response the handler would have sent, and every retry gets it.
func ExampleResponseResult() {
	resolve := func(ctx context.Context, rec durable.Record) (claim.Resolution, error) {
		// (ask the provider by rec.Ref.OperationID(); here: declined)
		res, err := claimhttp.ResponseResult(http.StatusPaymentRequired,
			http.Header{"Content-Type": {"application/json"}}, []byte(`{"error":"card declined"}`))
		if err != nil {
			return claim.Unresolved(), err
		}
		return claim.Resolved(durable.Failed, res), nil
	}
	_ = resolve // given to claim.NewReconciler

	res, _ := claimhttp.ResponseResult(http.StatusPaymentRequired, nil, []byte(`{"error":"card declined"}`))
	fmt.Println(res.StatusCode, string(res.Body))
	// Output: 402 {"error":"card declined"}
}
