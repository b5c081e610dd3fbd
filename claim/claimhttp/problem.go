package claimhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/internal/wire"
)

var problemTitles = map[string]string{
	claimclient.ProblemKeyMissing:   "Idempotency key missing",
	claimclient.ProblemKeyInvalid:   "Idempotency key invalid",
	claimclient.ProblemBodyInvalid:  "Request body invalid",
	claimclient.ProblemBodyTooLarge: "Request body too large",
	claimclient.ProblemKeyReused:    "Idempotency key reused",
	claimclient.ProblemInProgress:   "Request in progress",
	claimclient.ProblemUncertain:    "Outcome being reconciled",
	claimclient.ProblemUnavailable:  "Service unavailable",
	claimclient.ProblemUnidentified: "Caller not identified",
	claimclient.ProblemInternal:     "Internal error",
	problemNotFound:                 "Not Found",
}

// problemNotFound is the problem type of an unknown operation (the
// Operations handler): plain 404 semantics, RFC 9457's "about:blank".
const problemNotFound = "about:blank"

// problem is an RFC 9457 problem detail as the middleware writes it. Detail
// is a fixed sentence per cause: it never quotes the key, the tenant or the
// body.
type problem struct {
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
	p := problem{Type: typ, Title: problemTitles[typ], Status: status, Detail: detail, OperationID: opID}
	body, _ := json.Marshal(p) // cannot fail: strings and an int
	h := w.Header()
	h.Set("Content-Type", wire.ProblemContentType)
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
