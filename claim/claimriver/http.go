package claimriver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/riverqueue/river"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/wire"
)

// Handler returns the HTTP front of async mode for operation (for example
// "POST /deploys"): it reads the Idempotency-Key and the tenant, takes the
// request's fingerprint (package canon) and its body as the job's payload,
// runs the [WithValidate] check, and calls [Runner.Enqueue]. It answers:
//
//	first request (job inserted)        202, Location, Retry-After, {"id": "op_...", "state": "processing"}
//	same key while it runs or is        202, the same Location, Retry-After
//	  being reconciled (uncertain)
//	same key once finished              the stored status, headers and body, Idempotent-Replayed: true
//	same key, another request           422 problem (ProblemKeyReused)
//	no or bad key                       400 problem; no tenant, or one no record can have
//	                                    (durable.Scope.Validate), 401; body over WithMaxBody 413
//	refused by WithValidate             400 problem (ProblemBodyInvalid), or the claim.Reject
//	                                    result; nothing is reserved
//	store unreachable                   503 problem, Retry-After
//
// Its problems are claimhttp's: RFC 9457 application/problem+json with
// the members "type", "title" (stable per type), "status" and "detail" (a
// fixed sentence per cause; for a WithValidate refusal, the error's
// message). Every answer carries Idempotency-Retention, the operation's
// retention in whole seconds (claim.WithRetention). Serve the Location
// with claimhttp.Operations. Problems and the 202 body never carry the
// key, the tenant or the body; every 202 and problem is
// "Cache-Control: no-store".
func (r *Runner[TTx]) Handler(client *river.Client[TTx], operation string, tenant func(*http.Request) (string, error)) (http.Handler, error) {
	switch {
	case client == nil, tenant == nil:
		return nil, fmt.Errorf("%w: Handler needs a River client and a tenant function", ErrConfig)
	case durable.Scope{Tenant: "t", Operation: operation, Key: "k"}.Validate() != nil:
		return nil, fmt.Errorf("%w: Handler: invalid operation name", ErrConfig)
	}
	return &handler[TTx]{r: r, client: client, operation: operation, tenant: tenant}, nil
}

type handler[TTx any] struct {
	r         *Runner[TTx]
	client    *river.Client[TTx]
	operation string
	tenant    func(*http.Request) (string, error)
}

func (h *handler[TTx]) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	o := h.r.o
	// Every answer says how long the key is remembered, as claimhttp's do.
	w.Header().Set(claimclient.HeaderRetention, strconv.FormatInt(int64(h.r.c.Driver().Retention(h.operation)/time.Second), 10))
	key, err := wire.ParseKey(req.Header, "")
	switch {
	case errors.Is(err, wire.ErrKeyMissing):
		problem(w, http.StatusBadRequest, claimclient.ProblemKeyMissing, detailKeyMissing, 0)
		return
	case err != nil:
		problem(w, http.StatusBadRequest, claimclient.ProblemKeyInvalid, detailKeyInvalid, 0)
		return
	}
	tenant, err := h.tenant(req)
	if err != nil || tenant == "" || (durable.Scope{Tenant: tenant, Operation: h.operation, Key: key}).Validate() != nil {
		// A tenant no record can have (not valid UTF-8, a control
		// character, too long: durable.Scope.Validate) identifies nobody:
		// 401 as without one, not the 400 of a bad key, which blamed the
		// client's key for the tenant function's answer.
		problem(w, http.StatusUnauthorized, claimclient.ProblemUnidentified, detailUnidentified, 0)
		return
	}
	fp, err := canon.Request(req, canon.Options{Operation: h.operation, MaxBody: o.maxBody})
	switch {
	case errors.Is(err, canon.ErrTooLarge):
		problem(w, http.StatusRequestEntityTooLarge, claimclient.ProblemBodyTooLarge, detailTooLarge, 0)
		return
	case err != nil:
		problem(w, http.StatusBadRequest, claimclient.ProblemBodyInvalid, detailBodyInvalid, 0)
		return
	}
	body, err := io.ReadAll(req.Body) // canon read it already; these are its bytes
	if err != nil {
		problem(w, http.StatusBadRequest, claimclient.ProblemBodyInvalid, detailBodyInvalid, 0)
		return
	}
	if o.validate != nil && !h.valid(w, req, body) {
		return // refused before the claim: nothing reserved
	}
	out, err := h.r.Enqueue(req.Context(), h.client, claim.Request{
		Scope: durable.Scope{Tenant: tenant, Operation: h.operation, Key: key}, Fingerprint: string(fp),
	}, body)
	switch {
	case errors.Is(err, claim.ErrMismatch):
		problem(w, http.StatusUnprocessableEntity, claimclient.ProblemKeyReused, detailKeyReused, 0)
		return
	case errors.Is(err, claim.ErrInvalidScope):
		problem(w, http.StatusBadRequest, claimclient.ProblemKeyInvalid, detailKeyInvalid, 0)
		return
	case err != nil:
		problem(w, http.StatusServiceUnavailable, claimclient.ProblemUnavailable, detailUnavailable, o.retryAfter)
		return
	}
	if out.Kind == claim.Replayed && out.Result != nil {
		if !wire.HTTPReplayable(out.Result.StatusCode, out.Result.Version) {
			// Another adapter's format (a gRPC result written by a resolve
			// or a Reconciler): never replayed as a success.
			problem(w, http.StatusInternalServerError, claimclient.ProblemInternal, detailNotReplayed, 0)
			return
		}
		hdr := w.Header()
		for k, v := range out.Result.Headers {
			hdr[k] = append([]string(nil), v...)
		}
		hdr.Set(claimclient.HeaderReplayed, "true")
		status := out.Result.StatusCode
		if status == 0 {
			status = http.StatusOK
		}
		w.WriteHeader(status)
		_, _ = w.Write(out.Result.Body)
		return
	}
	// Acquired (the job is in), InProgress, Uncertain: the operation's
	// Location, the same for every request with this key.
	state := durable.Processing
	if out.Kind == claim.Uncertain {
		state = durable.Uncertain
	}
	b, _ := json.Marshal(struct {
		ID    string        `json:"id"`
		State durable.State `json:"state"`
	}{out.OperationID, state})
	hdr := w.Header()
	hdr.Set("Location", o.opPath+out.OperationID)
	hdr.Set("Retry-After", strconv.FormatInt(seconds(o.retryAfter), 10))
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(b)
}

// valid runs the WithValidate function on the request and answers a
// refusal: the result of a claim.Reject error as it is, any other error as
// a 400 problem with the error's message as its detail. It reports whether
// the request may go on to the claim.
func (h *handler[TTx]) valid(w http.ResponseWriter, req *http.Request, body []byte) bool {
	req.Body = io.NopCloser(bytes.NewReader(body))
	err := h.r.o.validate(req, body)
	if err == nil {
		return true
	}
	if res, ok := claim.RejectedResult(err); ok {
		hdr := w.Header()
		for k, v := range res.Headers {
			hdr[k] = append([]string(nil), v...)
		}
		hdr.Set("Cache-Control", "no-store")
		status := res.StatusCode
		if status == 0 {
			status = http.StatusBadRequest
		}
		w.WriteHeader(status)
		_, _ = w.Write(res.Body)
		return false
	}
	problem(w, http.StatusBadRequest, claimclient.ProblemBodyInvalid, err.Error(), 0)
	return false
}
