package claimclient

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// Fields the middleware adds to responses.
const (
	// HeaderReplayed marks a replayed response: "true". A replay is the
	// stored result of the key, final whatever its status; the transport
	// never retries it.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted marks a stored result whose body was too large to
	// store: "true". The replay carries the stored status and headers
	// with an empty body, never a truncated one.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
	// HeaderRetention is sent with every response to a guarded request:
	// the retention window of its operation in whole seconds (rounded
	// down), how long after the first accepted request a retry with the
	// same key is still answered from the record. After it the key starts
	// a new operation.
	HeaderRetention = "Idempotency-Retention"
)

// The problem types of the middleware's answers. Each is a stable URI (it
// identifies the problem; it need not resolve), with a stable title and
// status:
//
//	type                 status           title
//	ProblemKeyMissing    400              Idempotency key missing
//	ProblemKeyInvalid    400              Idempotency key invalid
//	ProblemBodyInvalid   400              Request body invalid
//	ProblemBodyTooLarge  413              Request body too large
//	ProblemKeyReused     422              Idempotency key reused
//	ProblemInProgress    409 (202 Poll)   Request in progress
//	ProblemUncertain     202              Outcome being reconciled
//	ProblemUnavailable   503              Service unavailable
//	ProblemUnidentified  401              Caller not identified
//	ProblemInternal      500              Internal error
//
// The ones a client acts on: in progress (409: retry with the same key
// after Retry-After, as the transport does; 202, under the server's
// claim.Poll policy or when the result is not recorded yet: poll the
// Location or retry), uncertain (202: the operation will not run again and is being
// reconciled; poll, do not send it again under a new key), and key reused
// (422: the key was sent before with a different request, a bug in the
// client).
const (
	ProblemKeyMissing   = "https://oncekey.dev/problems/key-missing"
	ProblemKeyInvalid   = "https://oncekey.dev/problems/key-invalid"
	ProblemBodyInvalid  = "https://oncekey.dev/problems/body-invalid"
	ProblemBodyTooLarge = "https://oncekey.dev/problems/body-too-large"
	ProblemKeyReused    = "https://oncekey.dev/problems/key-reused"
	ProblemInProgress   = "https://oncekey.dev/problems/in-progress"
	ProblemUncertain    = "https://oncekey.dev/problems/uncertain"
	ProblemUnavailable  = "https://oncekey.dev/problems/unavailable"
	ProblemUnidentified = "https://oncekey.dev/problems/unidentified"
	ProblemInternal     = "https://oncekey.dev/problems/internal"
)

// NewKey returns a fresh idempotency key: 128 bits from crypto/rand, as 32
// lowercase hex characters, valid in the bare form.
func NewKey() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("claimclient: new key: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
