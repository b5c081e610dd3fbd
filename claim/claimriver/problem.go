package claimriver

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/internal/wire"
)

// The problem vocabulary is claimhttp's (its package documentation, and
// its writeProblem): the same types, titles, members and fixed details, so
// that a client reads the answers of both handlers alike. The tests compare
// the two answer by answer.

var problemTitles = map[string]string{
	claimclient.ProblemKeyMissing:   "Idempotency key missing",
	claimclient.ProblemKeyInvalid:   "Idempotency key invalid",
	claimclient.ProblemBodyInvalid:  "Request body invalid",
	claimclient.ProblemBodyTooLarge: "Request body too large",
	claimclient.ProblemKeyReused:    "Idempotency key reused",
	claimclient.ProblemUnavailable:  "Service unavailable",
	claimclient.ProblemUnidentified: "Caller not identified",
	claimclient.ProblemInternal:     "Internal error",
}

// The fixed details, claimhttp's sentences for the same causes. None
// quotes the key, the tenant or the body.
const (
	detailKeyMissing   = "This request requires an " + wire.Header + " field."
	detailKeyInvalid   = "The " + wire.Header + " field must appear once and hold one quoted string or bare key of 1 to 255 printable ASCII characters."
	detailUnidentified = "The caller could not be identified."
	detailTooLarge     = "The request body is larger than this endpoint accepts."
	detailBodyInvalid  = "The request body could not be read or canonicalized."
	detailKeyReused    = "This key was already used for a different request."
	detailUnavailable  = "The request was not processed; retry after the Retry-After delay."
	detailNotReplayed  = "The stored result of this key cannot be replayed."
)

// problemDoc is an RFC 9457 problem with claimhttp's members (but
// "operation_id", which claimhttp sets on its in-progress and uncertain
// problems only: this handler answers those with its 202).
type problemDoc struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// problem writes a problem of type typ (its title is the type's), with
// Retry-After when retry is positive (whole seconds, at least 1).
func problem(w http.ResponseWriter, status int, typ, detail string, retry time.Duration) {
	b, _ := json.Marshal(problemDoc{Type: typ, Title: problemTitles[typ], Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", wire.ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if retry > 0 {
		h.Set("Retry-After", strconv.FormatInt(seconds(retry), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// seconds rounds d up to whole seconds, at least 1.
func seconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}
