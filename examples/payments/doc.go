// Payments is an example HTTP service whose effect is a call to another
// system: a (fake) payment gateway. It shows the workflow mode of package
// claimhttp and the path of an unknown outcome, from 202 uncertain to a
// reconciled answer.
//
//	go run ./examples/payments -demo                # embedded: nothing to install
//	DATABASE_URL=postgres://... REDIS_URL=redis://... go run ./examples/payments -demo
//	go run ./examples/payments -gateway-mode timeout-after-charge   # serve, and watch 202s resolve
//
// Route:
//
//	POST /payments      {"amount":1299,"currency":"EUR"}; needs Idempotency-Key
//
// # How a payment runs
//
// The middleware runs in workflow mode: the claim commits on its own with
// a lease, kept alive while the handler calls the gateway, and the answer
// is stored, fenced, when the handler returns. The handler passes the
// operation identity (claimhttp.OperationID) to the gateway as the
// gateway's own idempotency key, so every retry and takeover of one
// payment asks the gateway with the same key and it never charges twice
// either.
//
//   - The gateway answers: 201 with the charge (stored as completed), or
//     402 declined (stored as failed). Retries replay it.
//   - The gateway certainly charged nothing (unreachable, or it answered
//     with an error): the handler calls claimhttp.ReleaseKey and answers
//     503; the key is released, a retry runs again. The middleware never
//     releases on its own after the handler started.
//   - The gateway did not answer in time (-gateway-timeout): it may have
//     charged. The handler calls claimhttp.MarkUncertain, the client gets
//     202 "Outcome being reconciled", and so does every retry: nothing
//     runs again on its own.
//
// A claim.Reconciler runs every -reconcile-every. For each uncertain
// payment (and each one whose worker vanished) it asks the gateway for the
// charge made with the operation identity: found, it stores the same 201
// or 402 the handler would have stored; not found, it stores a final 424
// "Payment not made" (this gateway never charges after its caller gave
// up). The next retry with the key gets that answer, replayed.
//
// Polling: GET the 202's Location, /operations/op_... (claimhttp.Operations:
// the state, uncertain until the reconciler decided, then completed or
// failed with the stored status; another tenant's is a 404), or re-send
// the request with the same key, which replays the stored answer once
// there is one.
//
// # The fake gateway
//
// It is an HTTP server of its own on a free loopback port, with its own
// idempotency keys: the same key and parameters return the same charge,
// the same key with other parameters is refused. -gateway-mode switches
// it to timeout-after-charge (it charges, then never answers) or
// timeout-before-charge (it never answers and charges nothing). It
// declines amounts above 100000.
//
// # Services
//
// As in examples/orders: -postgres (default $DATABASE_URL) and -redis
// (default $REDIS_URL) name the servers; each one not named is replaced by
// its embedded stand-in (a SQLite file, an in-process Redis). The tenant
// comes from the demo-only "Authorization: Bearer <tenant>"
// (examples/internal/demoauth): do not copy that part.
//
// # The demo
//
// -demo starts the gateway and the service on free ports, with a 1s
// gateway timeout and a reconciler every 250ms, and fires at itself: 20
// concurrent requests with one key, the key reused for another amount, and
// a payment whose gateway call times out after charging, followed until
// the reconciler resolved it. It prints what happened and exits 0 when
// every expectation held, 1 otherwise.
package main
