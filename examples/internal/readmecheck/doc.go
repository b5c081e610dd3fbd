// Package readmecheck holds the test that type-checks the Go snippets of the
// repository's README.md (and of chaos/README.md and bench/README.md, which
// hold the README's chaos and performance material) against the library,
// so a snippet that stops compiling fails CI. It has no API.
//
// Run it alone with
//
//	go test ./examples/internal/readmecheck
//
// Each ```go block is checked on its own as the body of a function, after a
// shared prelude (in readme_test.go) that declares what the snippets assume:
// ctx, a pgx pool, a Redis client, the request, a fictional payment gateway.
// A snippet that needs a new assumption gets it in the prelude; an unused
// variable or import is not an error, since snippets are fragments.
package readmecheck
