// Package problem writes the RFC 9457 problems of the library's HTTP
// handlers (claimhttp, claimriver): one vocabulary of types, titles,
// members and fixed details.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/durable/driver/wire"
)

// NotFound is the problem type of an unknown operation (the
// operations resource): plain 404 semantics, RFC 9457's "about:blank".
const NotFound = "about:blank"

// problemTitles are the titles of the problem types, one per type, the
// same from every HTTP handler of the library.
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
	NotFound:                        "Not Found",
}

// The fixed details of the causes more than one handler answers. None
// quotes the key, the tenant or the body.
const (
	DetailKeyMissing   = "This request requires an " + wire.Header + " field."
	DetailKeyInvalid   = "The " + wire.Header + " field must appear once and hold one quoted string or bare key of 1 to 255 printable ASCII characters."
	DetailUnidentified = "The caller could not be identified."
	DetailTooLarge     = "The request body is larger than this endpoint accepts."
	DetailBodyInvalid  = "The request body could not be read or canonicalized."
	DetailKeyReused    = "This key was already used for a different request."
	DetailUnavailable  = "The request was not processed; retry after the Retry-After delay."
)

// problem is an RFC 9457 problem detail as the library's HTTP handlers
// write it. Detail is a fixed sentence per cause (or the application's
// own validation message): it never quotes the key, the tenant or the
// body.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// OperationID is the operation identity on in-progress and
	// uncertain problems: safe to show, it reveals nothing of the key.
	OperationID string `json:"operation_id,omitempty"`
}

// Write writes a problem of type typ (its title is the type's),
// "Cache-Control: no-store", and Retry-After when retry is positive
// (rounded up to whole seconds, at least 1). opID, when set, is the
// problem's operation_id.
func Write(w http.ResponseWriter, status int, typ, detail, opID string, retry time.Duration) {
	body, _ := json.Marshal(problem{Type: typ, Title: problemTitles[typ], Status: status, Detail: detail, OperationID: opID}) // cannot fail: strings and an int
	h := w.Header()
	h.Set("Content-Type", wire.ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if retry > 0 {
		h.Set("Retry-After", strconv.FormatInt(Seconds(retry), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Seconds rounds d up to whole seconds, at least 1.
func Seconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}
