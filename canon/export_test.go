package canon

import "errors"

// The specific causes behind ErrInvalid and the internal limits, for the
// external tests: callers need not tell these apart, the tests must.
var (
	ErrSyntax      error = errSyntax
	ErrUTF8        error = errUTF8
	ErrSurrogate   error = errSurrogate
	ErrDuplicate   error = errDuplicate
	ErrOverflow    error = errOverflow
	ErrTooDeep     error = errTooDeep
	ErrPrecision   error = errPrecision
	ErrQuery       error = errQuery
	ErrForm        error = errForm
	ErrReadBody          = errReadBody
	MaxDepth             = maxDepth
	DefaultMaxBody       = defaultMaxBody
)

// SyntaxError is the type of the JSON errors, whose Offset and Detail the
// tests check.
type SyntaxError = syntaxError

// TooLargeLimit returns the limit a too-large error reports, or -1.
func TooLargeLimit(err error) int64 {
	var tl *tooLargeError
	if !errors.As(err, &tl) {
		return -1
	}
	return tl.limit
}
