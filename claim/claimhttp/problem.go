package claimhttp

import (
	"net/http"
	"time"

	"github.com/oncekey/oncekey/claim/driver/problem"
)

// problemNotFound is the problem type of an unknown operation (the
// Operations handler): plain 404 semantics, RFC 9457's "about:blank".
const problemNotFound = problem.NotFound

// writeProblem writes an RFC 9457 problem (problem.Write, the one
// writer of the library's HTTP handlers): its title from its type, a fixed
// detail that never quotes the key, the tenant or the body, opID on
// in-progress and uncertain problems, and Retry-After when retry is
// positive (rounded up to whole seconds, at least 1).
func writeProblem(w http.ResponseWriter, status int, typ, detail, opID string, retry time.Duration) {
	problem.Write(w, status, typ, detail, opID, retry)
}

// seconds rounds d up to whole seconds, at least 1.
func seconds(d time.Duration) int64 { return problem.Seconds(d) }
