// Package routers holds tests that put claimhttp behind routers other than
// net/http's ServeMux. A router that does not set r.Pattern (chi sets it
// only in some versions) needs claimhttp.WithOperation naming the route,
// never the raw path; see chi_test.go.
package routers
