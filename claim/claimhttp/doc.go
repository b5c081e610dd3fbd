// Package claimhttp puts the claim protocol of package claim in front of
// net/http handlers ([Middleware]), following the IETF httpapi
// Idempotency-Key draft. Its clients use package claimclient: a retrying
// transport that sends keys and retries safely, and the problem types and
// response fields they match.
//
//	claimer, _ := claim.New[pgx.Tx](store, claim.WithRedis(rdb, lua.Options{}))
//	guard, err := claimhttp.Middleware(claimer, tenantFromPrincipal, // from your authentication
//		claimhttp.WithInTransaction())
//	mux.Handle("POST /orders", guard(http.HandlerFunc(createOrder)))
//
// # What the middleware does with a guarded request
//
// Guarded requests are those with a guarded method (POST and PATCH by
// default). In order, and before anything is reserved:
//
//  1. The key is parsed from the Idempotency-Key field ([WithHeader]): the
//     draft's RFC 8941 sf-string `"..."` (only \" and \\ are escapes, no
//     parameters) or a bare key (visible ASCII without spaces, '"', ',',
//     ';' or '\'), on exactly one field line, 1 to 255 printable ASCII
//     characters once unquoted. Missing: 400 (unless [WithOptional]
//     allows it); malformed: 400.
//  2. The tenant comes from the tenant function given to [Middleware]
//     (authentication, never a client header); the operation from
//     [WithOperation], by default the method and the matched route
//     pattern, so the same key on two endpoints never collides.
//  3. The request is fingerprinted by package canon (method, operation,
//     path, query, chosen headers, canonical body minus excluded members).
//     An invalid body is 400, one over the limit 413.
//  4. The key is claimed. Only with a durable claim does the handler run:
//     if the durable store is down the answer is 503 and the handler never
//     runs.
//  5. The handler's response is buffered and published only after its
//     result is durable. Its status decides whether it is stored as
//     completed, stored as failed, or released. In transaction mode 1xx to
//     3xx are completed; 408, 409, 425 and 429 ("not now", not "never")
//     and 5xx release, since the rollback makes that safe; every other 4xx
//     is failed, a final answer replayed rather than re-evaluated. In
//     workflow mode every response is stored (below 400 completed, the
//     rest failed). In either mode a handler releases the key by calling
//     [ReleaseKey].
//
// # Two modes
//
// With [WithInTransaction] the handler runs inside [claim.Claimer.Do]:
// [Tx] gives it the transaction that stores the record, so its business row
// and the stored result commit together or not at all. A released response
// (a 5xx, say) rolls the transaction back. The handler must not make long
// external calls.
//
// Without it (workflow mode) the claim commits on its own with a lease that
// is renewed while the handler runs ([claim.Lease.KeepAlive]); the handler
// passes [OperationID] downstream as that system's idempotency key, may call
// [MarkUncertain] when a downstream outcome is unknown, and the response is
// stored fenced.
//
// # The rule after a workflow handler started
//
// Once a workflow-mode handler has started, its external effect may have
// happened. From then on the middleware only records an outcome: completed,
// failed, or uncertain ("do not run again; reconcile"). It never releases
// the key on its own initiative. A release after the start happens only on
// the application's word that nothing happened: [ReleaseKey]. So:
//
//   - The work outlives its client. The handler's context is detached from
//     the request's cancellation: a client that disconnects cancels
//     nothing, the lease is renewed until the handler returns, and the
//     client's retry waits (409) and then replays the result. The handler's
//     context is cancelled only when the lease is lost (context.Cause is
//     [claim.ErrFenced] or [claim.ErrLeaseExpired]).
//   - Renewals that failed do not lose the work: if no one took the key
//     over, the fenced completion still succeeds and is published. A
//     handler whose key was taken over never publishes its response: the
//     client gets 409 in progress (the new owner's result is what a retry
//     will see).
//   - A 5xx, 408, 409, 425 or 429 answer is stored as failed and replayed.
//   - A response over the [WithMaxResponseBody] limit is stored by its
//     status without its body ("Idempotent-Body-Omitted: true"), and the
//     first client gets what every retry will.
//   - A panicking handler's record is marked uncertain, and the panic
//     continues. (In transaction mode the rollback removes the claim: the
//     key is free, which is safe there.)
//   - The finishing write is retried while the store is unreachable, for
//     up to [WithFinishTimeout]. If it still is, the client gets 202
//     (in progress, Location) rather than "not processed", the
//     record stays processing under its lease, retries see it in progress,
//     and the middleware keeps the lease renewed and retries in the
//     background until the outcome is written or the lease runs out. Only
//     a store outage longer than the lease leaves the operation to a
//     takeover, as a crash would; that is what passing [OperationID]
//     downstream as the idempotency key is for.
//
// # Answers
//
// The problem types are the constants of package claimclient
// (claimclient.ProblemKeyMissing and so on):
//
//	situation                                 status  problem type
//	key missing where required                400     ProblemKeyMissing
//	key malformed, too long, not ASCII, twice 400     ProblemKeyInvalid
//	body not canonicalizable                  400     ProblemBodyInvalid
//	body over Canon.MaxBody                   413     ProblemBodyTooLarge
//	no tenant                                 401     ProblemUnidentified
//	same key, different request               422     ProblemKeyReused
//	first request still processing            409     ProblemInProgress, Retry-After
//	  ... with claim.WithPoll                 202     ProblemInProgress, Location
//	handled, result not recorded yet          202     ProblemInProgress, Location
//	outcome unknown, being reconciled         202     ProblemUncertain, Location
//	durable store down                        503     ProblemUnavailable, Retry-After
//	operation not nameable, internal error    500     ProblemInternal
//	completed or failed before                the stored status, headers, body,
//	                                                  plus Idempotent-Replayed: true
//
// Problems are RFC 9457 application/problem+json documents with the members
// "type", "title" (stable per type), "status", "detail" (a fixed sentence
// per cause) and, on in-progress and uncertain answers, "operation_id" (see
// [OperationID]); none quotes the key, the tenant or the body. Location is
// the [WithOperationPath] prefix followed by the operation identity,
// "/operations/op_...", which [Operations] serves; re-sending the request
// with the same key is always a valid way to poll.
//
// # Retention
//
// A key is remembered for the retention of its operation
// ([claim.WithRetention] and [claim.WithOperationRetention], 24 hours by
// default) from when its first request was accepted. Every response to a
// guarded request says so in whole seconds: "Idempotency-Retention: 86400".
// After the window the record is gone and the same key starts a new
// operation.
//
// # Replays and their limits
//
// This section is the one description of what is stored and replayed; the
// options that tune it ([WithStoredHeaders], [WithMaxStoredBody],
// [WithMaxResponseBody]) only give their defaults.
//
// A replay carries the stored status, the stored headers
// ([WithStoredHeaders], by default the representation and location headers, never
// Set-Cookie) and the stored body byte for byte, plus
// "Idempotent-Replayed: true". The first response carries every header the
// handler set.
//
// Bodies up to [WithMaxStoredBody] (1 MiB) are stored. A larger body
// reaches the first client in full, but the result is stored without it:
// status, stored headers less Content-Type, and the resource id (the
// Location header); its replays carry an empty body and
// "Idempotent-Body-Omitted: true", never a truncated body passed off as
// complete. A handler that writes more than [WithMaxResponseBody] (16
// MiB) gets [ErrResponseTooLarge] from Write: in transaction mode the
// transaction rolls back and the client gets 500; in workflow mode the
// result is stored without its body, as above.
//
// Streaming is not supported on guarded routes: nothing may reach the
// client before the result is durable, so the handler's writer implements
// neither http.Flusher nor http.Hijacker (http.ResponseController reports
// http.ErrNotSupported) and informational 1xx responses are dropped.
// Trailers are not stored.
//
// # The client side
//
// Package claimclient's Transport adds a fresh key to unsafe requests,
// keeps it across its retries, and retries only what is safe to retry
// (connection errors, 5xx, 429 and in-progress answers, never a replay)
// within a retry budget.
package claimhttp
