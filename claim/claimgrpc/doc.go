// Package claimgrpc makes unary gRPC calls execute at most once per
// tenant, operation and idempotency key, with the claim protocol of
// package claim, and replays their stored reply or status to every retry.
// It is its own module (github.com/oncekey/oncekey/claim/claimgrpc) so that
// users of the library who do not use gRPC never get its dependencies.
//
// # Server
//
// [UnaryServerInterceptor] guards the unary methods it is chained on (all,
// or those [WithMethods] selects). Chain it after authentication: the
// tenant comes from a function of the call's context, never from a client
// header. For each guarded call it:
//
//  1. reads the key from the metadata entry [MetadataKey]
//     ("idempotency-key"): exactly one value of 1 to 255 printable ASCII
//     characters. Missing or invalid: InvalidArgument (ErrorInfo reason
//     [ReasonKeyMissing] or [ReasonKeyInvalid]), nothing reserved;
//  2. names the operation: the full method ("/pkg.Service/Method"), or
//     [WithOperation]; reads the tenant (Unauthenticated when there is
//     none, nothing reserved);
//  3. fingerprints the request: the full method, the request message's
//     full name and its deterministic marshalling
//     (proto.MarshalOptions{Deterministic: true}: map entries sorted);
//  4. claims with [claim.Claimer.Claim] (workflow mode) and answers as the
//     next section says.
//
// # Answers
//
//   - Acquired: the handler runs, with the lease kept alive meanwhile; its
//     answer is stored (next section) and returned.
//   - Replayed: the stored reply message, or the stored status with its
//     code, message and details, and the response header [MetadataReplayed]
//     "true". The handler does not run.
//   - In progress: Aborted with an ErrorInfo ([Domain], reason
//     [ReasonInProgress], metadata "operation_id") and a RetryInfo (the
//     holder's remaining lease, capped by [WithRetryAfter]). Aborted, not
//     AlreadyExists: the call has not failed for good, and the same call
//     with the same key will get the result; gRPC's status guide gives
//     Aborted to concurrency conflicts that a retry resolves.
//   - Uncertain: Aborted, reason [ReasonUncertain], with a RetryInfo: the
//     first call's outcome is being reconciled; it will not run again, and
//     a retry gets this answer until a [claim.Reconciler] resolved it, then
//     the result.
//   - Key reused with a different request: FailedPrecondition, reason
//     [ReasonKeyReused]. FailedPrecondition, not InvalidArgument: the request
//     is valid in itself and is refused because of the state the earlier
//     use of the key left; the client must not retry it with this key.
//   - Durable store unreachable: Unavailable, reason [ReasonUnavailable],
//     with a RetryInfo. The handler did not run and nothing is reserved;
//     retry with the same key.
//
// # What is stored, and how a replay is decoded
//
// A reply is stored as completed: its message marshalled, with its full
// protobuf name. An error is stored as failed, whatever its code: its
// google.rpc.Status (code, message, details). Response metadata (headers,
// trailers) the handler set is not stored nor replayed. The stored format
// has a representation version of its own (durable.Result.Version 1001;
// package claimhttp's is 1). A result in any other format (what oncekey
// resolve wrote before -format, a hand-built HTTP status and body) is
// never replayed as a success: the call gets Internal ("the stored result
// of this key cannot be replayed") and the interceptor logs why. Results
// this package stored before 1001 existed, under version 1, still replay.
//
// To settle an operation from outside (a [claim.Reconciler]'s resolve
// function, oncekey resolve -format grpc), store what the handler would
// have returned through the same encoders: [ReplyResult] as completed,
// [StatusResult] as failed.
//
// The interceptor sees the handler's reply type only as the value the
// handler returns, and a replay must not run the handler; so a replay
// resolves the stored name in the global protobuf registry
// (protoregistry.GlobalTypes), where generated code registers every
// message, and unmarshals into a new message of that type. A type missing
// from the registry (a dynamic message) cannot be replayed: the call gets
// Internal and the interceptor logs it. The client decodes the bytes into
// its own reply type, as for any call.
//
// The fingerprint relies on deterministic marshalling, which is stable for
// one binary and its schema but is not a canonical form across protobuf
// implementations or schema changes: a retry from a client built with a
// changed schema (a new field set) is a different request. Keep the
// retention longer than a deployment, and use a new key for a new request.
//
// # After the handler started
//
// Once the handler has started, an effect may have happened: the
// interceptor never releases the key on its own. A handler that returns an
// error, even Unavailable, has its status stored and replayed; a handler
// that knows nothing happened calls [ReleaseKey] before returning (its
// answer is then returned as it is, and the key runs again on the next
// call). A handler that calls [MarkUncertain] gets the record marked
// uncertain; a panic marks it uncertain too, then the panic goes on (gRPC
// does not recover panics: chain a recovery interceptor before this one).
// A reply that cannot be stored (not a protobuf message) is marked
// uncertain, and so is an error from a handler whose context the lease
// ended (renewals failed and only the start margin was left, see
// [claim.Lease.KeepAlive]): that error says the work was interrupted, not
// what became of it.
//
// The handler's context is detached from the call's cancellation and
// deadline (its values and metadata are kept): a client that disconnects
// or times out does not stop the work, which completes once and is
// replayed to the retry. The context ends only when the lease is lost
// (see [claim.Lease.KeepAlive]). When the outcome cannot be written
// within [WithFinishTimeout] (the store went down), the caller gets
// Aborted with reason [ReasonPending], retries see the call in progress,
// and the interceptor goes on writing it in the background while it holds
// the lease, as package claimhttp does.
//
// Inside the handler, [OperationID] is the operation's stable identity to
// pass downstream as that system's idempotency key, and [Token] its
// fencing token.
//
// # Client
//
// [UnaryClientInterceptor] gives every call a key: the caller's
// ([KeyContext], or idempotency-key metadata it set), else a new random
// one, made once per logical call and sent by all its attempts, both those
// of [WithAttempts] and those of gRPC's own retry policy. A caller that
// retries a logical call itself, across calls of the interceptor, passes
// the same key with [KeyContext].
//
// A key makes a retry safe only if the server guards the method, and the
// client cannot see that in every answer: a dropped connection's
// Unavailable carries no server metadata at all. So [WithAttempts] retries
// the server interceptor's own answers, which show the method is guarded
// (Unavailable with [ReasonUnavailable]: it did not run; Aborted with
// [ReasonInProgress] or [ReasonPending], after the RetryInfo delay), any
// other Unavailable only for the methods [WithGuardedMethods] names, and
// never an answer marked replayed: that is the stored result, final even
// when its code is Unavailable. gRPC's own retry policy knows none of
// this: configure it only for guarded methods.
//
// Only unary calls are guarded; streams are not.
package claimgrpc
