package claimhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// ProblemContentType is the media type of every error response the
// middleware writes (RFC 9457).
const ProblemContentType = "application/problem+json"

// The problem types of the middleware. Each is a stable URI (they identify
// the problem; they need not resolve), with a stable title and status:
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

var problemTitles = map[string]string{
	ProblemKeyMissing:   "Idempotency key missing",
	ProblemKeyInvalid:   "Idempotency key invalid",
	ProblemBodyInvalid:  "Request body invalid",
	ProblemBodyTooLarge: "Request body too large",
	ProblemKeyReused:    "Idempotency key reused",
	ProblemInProgress:   "Request in progress",
	ProblemUncertain:    "Outcome being reconciled",
	ProblemUnavailable:  "Service unavailable",
	ProblemUnidentified: "Caller not identified",
	ProblemInternal:     "Internal error",
}

// Problem is an RFC 9457 problem detail as the middleware writes it. Detail
// is a fixed sentence per cause: it never quotes the key, the tenant or the
// body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// OperationID is the operation identity (see [OperationID]) on
	// in-progress and uncertain problems: safe to show, it reveals nothing
	// of the key.
	OperationID string `json:"operation_id,omitempty"`
}

// writeProblem writes p, setting its title from its type, and Retry-After
// when retry is positive (rounded up to whole seconds, at least 1).
func writeProblem(w http.ResponseWriter, status int, typ, detail, opID string, retry time.Duration) {
	p := Problem{Type: typ, Title: problemTitles[typ], Status: status, Detail: detail, OperationID: opID}
	body, _ := json.Marshal(p) // cannot fail: strings and an int
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if retry > 0 {
		h.Set("Retry-After", strconv.FormatInt(seconds(retry), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// seconds rounds d up to whole seconds, at least 1.
func seconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
