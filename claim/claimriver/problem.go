package claimriver

import (
	"net/http"
	"time"

	problems "github.com/oncekey/oncekey/claim/driver/problem"
)

// The problem vocabulary is claimhttp's, written by the same code
// (problems.Write): the same types, titles, members and fixed details,
// so that a client reads the answers of both handlers alike. The tests
// compare the two answer by answer.
const (
	detailKeyMissing   = problems.DetailKeyMissing
	detailKeyInvalid   = problems.DetailKeyInvalid
	detailUnidentified = problems.DetailUnidentified
	detailTooLarge     = problems.DetailTooLarge
	detailBodyInvalid  = problems.DetailBodyInvalid
	detailKeyReused    = problems.DetailKeyReused
	detailUnavailable  = problems.DetailUnavailable
	detailNotReplayed  = "The stored result of this key cannot be replayed."
)

// problem writes a problem of type typ, with Retry-After when retry is
// positive. This handler answers in-progress and uncertain with its 202,
// so its problems carry no operation_id.
func problem(w http.ResponseWriter, status int, typ, detail string, retry time.Duration) {
	problems.Write(w, status, typ, detail, "", retry)
}

// seconds rounds d up to whole seconds, at least 1.
func seconds(d time.Duration) int64 { return problems.Seconds(d) }
