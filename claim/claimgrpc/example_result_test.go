package claimgrpc_test

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable"
)

// A claim.Reconciler's resolve function settles an uncertain Charge call
// after asking the payment provider: the charge went through, so it stores
// the reply the handler would have returned, and every retry gets it.
func ExampleReplyResult() {
	resolve := func(ctx context.Context, rec durable.Record) (claim.Resolution, error) {
		// (ask the provider by rec.Ref.OperationID(); here: it charged)
		res, err := claimgrpc.ReplyResult(wrapperspb.String("ch_1"))
		if err != nil {
			return claim.Unresolved(), err
		}
		return claim.Resolved(durable.Completed, res), nil
	}
	_ = resolve // given to claim.NewReconciler

	res, _ := claimgrpc.ReplyResult(wrapperspb.String("ch_1"))
	fmt.Println(codes.Code(res.StatusCode))
	// Output: OK
}

// The provider declined the charge: the resolve function stores the status
// the handler would have returned, details included, as failed; a retry
// gets FailedPrecondition "card declined", marked replayed.
func ExampleStatusResult() {
	res, err := claimgrpc.StatusResult(status.New(codes.FailedPrecondition, "card declined"))
	if err != nil {
		fmt.Println(err)
		return
	}
	resolution := claim.Resolved(durable.Failed, res)
	_ = resolution // returned by a claim.Reconciler's resolve function
	fmt.Println(codes.Code(res.StatusCode))

	// An OK status is no failure: refused.
	_, err = claimgrpc.StatusResult(status.New(codes.OK, ""))
	fmt.Println(err != nil)
	// Output:
	// FailedPrecondition
	// true
}

// Client and server share the list of guarded methods: the server guards
// them, and the client retries a dropped connection's Unavailable for them
// only, under the same key. Another method's Unavailable is returned as it
// is, since nothing stops a second run of it.
func ExampleWithGuardedMethods() {
	guarded := func(fullMethod string) bool { return fullMethod == "/shop.v1.Payments/Charge" }

	// Server: claimgrpc.UnaryServerInterceptor(c, tenant, claimgrpc.WithMethods(guarded))
	_ = claimgrpc.WithMethods(guarded)

	client, err := claimgrpc.UnaryClientInterceptor(claimgrpc.WithAttempts(3), claimgrpc.WithGuardedMethods(guarded))
	fmt.Println(client != nil, err)
	// Output: true <nil>
}
