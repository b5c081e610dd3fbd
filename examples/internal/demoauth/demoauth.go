// Package demoauth is the DEMO-ONLY authentication of the example services:
// it takes the tenant from "Authorization: Bearer <tenant>" as it is,
// believing whatever the client says.
//
// It is a package of its own, shared by examples/orders and
// examples/payments, so that the one part of the examples you must not
// copy stands apart. A real service verifies a credential in its
// authentication middleware (a session, a signed token, a client
// certificate) and puts the verified principal in the request's context;
// the tenant function it gives claimhttp.Middleware reads that principal.
// The tenant must never come from a header the client controls, or one
// client could replay another's results by sending its key.
package demoauth

import (
	"context"
	"errors"
	"net/http"
	"strings"
)

// ErrUnauthenticated is returned by [Tenant] for a request without a
// (well-formed) demo credential.
var ErrUnauthenticated = errors.New("demoauth: not authenticated")

type tenantKey struct{}

// Middleware reads "Authorization: Bearer <tenant>" and puts the tenant in
// the request's context for [Tenant]. A tenant is 1 to 64 letters, digits,
// '-', '_' or '.'; anything else leaves the request unauthenticated. It
// never rejects a request itself: handlers and the idempotency middleware
// answer 401.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t, ok := bearer(r.Header.Get("Authorization")); ok && valid(t) {
			r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, t))
		}
		next.ServeHTTP(w, r)
	})
}

// Tenant returns the tenant [Middleware] authenticated, or
// [ErrUnauthenticated]. It fits claimhttp.Middleware's tenant function.
func Tenant(r *http.Request) (string, error) {
	if t, _ := r.Context().Value(tenantKey{}).(string); t != "" {
		return t, nil
	}
	return "", ErrUnauthenticated
}

func bearer(v string) (string, bool) {
	const prefix = "bearer "
	if len(v) <= len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", false
	}
	return v[len(prefix):], true
}

func valid(t string) bool {
	if len(t) > 64 {
		return false
	}
	for _, c := range []byte(t) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}
