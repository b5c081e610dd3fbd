// Package web holds the HTTP odds and ends the example services share:
// JSON and RFC 9457 problem answers in the format of claimhttp's own
// problems, and the reading and checking of a JSON request body before the
// idempotency middleware sees it.
//
// Nothing in it is about oncekey; where to put the check (in front of
// claimhttp.Middleware, so that a refused request reserves nothing) is
// shown in each example's service.go. It is an internal package because it
// is scaffolding for the examples, not part of the library.
package web

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
)

// ProblemContentType is the media type of RFC 9457 problems.
const ProblemContentType = "application/problem+json"

// ProblemDoc is an RFC 9457 problem document, with the members the
// middleware's problems have (see the claimhttp package documentation).
type ProblemDoc struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Status      int    `json:"status"`
	Detail      string `json:"detail,omitempty"`
	OperationID string `json:"operation_id,omitempty"`
}

// Problem writes an RFC 9457 problem, in the middleware's format.
func Problem(w http.ResponseWriter, status int, typ, title, detail string) {
	w.Header().Set("Content-Type", ProblemContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(ProblemDoc{Type: typ, Title: title, Status: status, Detail: detail})
}

// JSON writes v as a JSON answer with status.
func JSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// BodyCheck says how [ValidJSON] reads and checks a body of type T.
type BodyCheck[T any] struct {
	MaxBytes int64  // the largest body accepted
	Problem  string // the problem type of a refusal
	Title    string // its title, "Invalid order"
	Example  string // a valid body, named in the refusal of one that does not decode
	// Validate checks the decoded body; its error is the refusal's detail.
	Validate func(T) error
}

type bodyKey[T any] struct{}

// ValidJSON returns a middleware that refuses, with a problem, a request
// whose body is not one JSON object of type T (Content-Type
// application/json, at most MaxBytes, no unknown fields) that Validate
// accepts. It puts the decoded T in the request's context ([Body]) and the
// body back for what comes next (the middleware's fingerprint).
func ValidJSON[T any](c BodyCheck[T]) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
				Problem(w, http.StatusUnsupportedMediaType, c.Problem, c.Title, "Send Content-Type: application/json.")
				return
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.MaxBytes))
			if err != nil {
				Problem(w, http.StatusRequestEntityTooLarge, c.Problem, c.Title, "The body is too large.")
				return
			}
			var in T
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&in); err != nil || dec.More() {
				Problem(w, http.StatusBadRequest, c.Problem, c.Title, "Send one JSON object: "+c.Example+".")
				return
			}
			if err := c.Validate(in); err != nil {
				Problem(w, http.StatusBadRequest, c.Problem, c.Title, err.Error())
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), bodyKey[T]{}, in)))
		})
	}
}

// Body returns the body [ValidJSON] put in ctx, or T's zero value.
func Body[T any](ctx context.Context) T {
	v, _ := ctx.Value(bodyKey[T]{}).(T)
	return v
}
