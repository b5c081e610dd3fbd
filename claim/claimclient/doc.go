// Package claimclient is the client side of the idempotency protocol that
// package claimhttp serves: a retrying [Transport] that sends idempotency
// keys and retries only what is safe to retry, a [RetryBudget] that bounds
// how much load retries add during an incident, and the protocol's
// vocabulary a client matches (the response fields and problem types).
//
//	tr, err := claimclient.NewTransport(nil)
//	if err != nil { ... }
//	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
//	resp, err := client.Post(url, "application/json", body) // keyed, retried
//
// # What the transport does
//
// [Transport] adds a fresh 128-bit key in the quoted form to requests with
// unsafe methods, keeps it across its retries, and retries connection
// errors, 5xx, 429 and in-progress 409s with capped exponential backoff and
// full jitter, honouring Retry-After and the request's deadline, within a
// [RetryBudget] so that a fleet of clients adds a bounded fraction of load
// during an incident. It never retries 400 or 422, nor a replay of a stored
// result ([HeaderReplayed]), whatever its status.
//
// A caller that must survive its own restart (retry the same operation
// from another process) makes the key itself with [NewKey], stores it with
// the pending work, and sets it on the request; the transport keeps a key
// it finds. The key may be sent bare (visible ASCII without spaces, '"',
// ',', ';' or '\', as [NewKey]'s keys are) or as an RFC 8941 sf-string,
// the form the transport itself sends; for a valid key (1 to 255 printable
// ASCII characters) that is what strconv.Quote returns.
//
// # What the answers mean
//
// The package documentation of claimhttp lists every answer of the
// middleware; problems are RFC 9457 application/problem+json documents
// whose "type" member is one of the Problem constants below, with "title",
// "status", "detail" and, on in-progress and uncertain answers,
// "operation_id" (the operation's identity, which reveals nothing of the
// key).
package claimclient
