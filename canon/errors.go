package canon

import (
	"errors"
	"fmt"
	"strconv"
)

// The sentinels below classify every error this package returns, except an
// error reading the request body, which wraps the reader's error. The
// package documentation says how an HTTP layer maps them.
var (
	// ErrInvalid matches every error for input that cannot be fingerprinted:
	// JSON that is malformed or that RFC 8785 forbids (invalid UTF-8, a lone
	// surrogate escape, a duplicate member name, a number beyond a double's
	// range, nesting deeper than 1000 levels), an integer literal a double
	// cannot hold exactly on the fingerprinting path, and a URL query or
	// form body that does not parse (a bad percent escape or a ';'
	// separator). For JSON the message gives the byte offset where the
	// problem was found.
	ErrInvalid = errors.New("canon: invalid input")

	// ErrTooLarge matches the error [Request] returns for a body longer than
	// [Options.MaxBody], detected without reading past the limit.
	ErrTooLarge = errors.New("canon: body too large")

	// ErrConfig matches the error [Request] returns for an [Options] value
	// that is unusable: a negative MaxBody, an empty or malformed header
	// name, or an Exclude entry that is not an RFC 6901 JSON Pointer to a
	// member. It is a programming error, not a client error, and is named
	// as every package's configuration error is.
	ErrConfig = errors.New("canon: invalid configuration")
)

// syntaxError reports JSON that cannot be canonicalized, with the byte
// offset where the problem was found (in its message too). It matches
// [ErrInvalid] with errors.Is: callers branch on that sentinel, not on this
// type.
//
// The message never quotes the input: bodies may carry personal data and
// error strings end up in logs.
type syntaxError struct {
	Offset int64  // byte offset into the JSON input
	Detail string // a fixed description, such as "expected ':'"; may be empty
	kind   *cause
}

func (e *syntaxError) Error() string {
	msg := e.kind.msg
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg + " at offset " + strconv.FormatInt(e.Offset, 10)
}

// Unwrap returns the cause, which matches [ErrInvalid].
func (e *syntaxError) Unwrap() error { return e.kind }

// cause is the specific reason for an [ErrInvalid]; the package's tests
// tell them apart, callers need not.
type cause struct{ msg string }

func (c *cause) Error() string { return c.msg }
func (c *cause) Unwrap() error { return ErrInvalid }

var (
	errSyntax    = &cause{"canon: invalid JSON"}
	errUTF8      = &cause{"canon: invalid UTF-8"}
	errSurrogate = &cause{"canon: lone surrogate in \\u escape"}
	errDuplicate = &cause{"canon: duplicate member name"}
	errOverflow  = &cause{"canon: number overflows a double"}
	errTooDeep   = &cause{"canon: nesting too deep"}
	errPrecision = &cause{"canon: integer literal exceeds double precision"}
	errQuery     = &cause{"canon: invalid query"}
	errForm      = &cause{"canon: invalid form body"}
	errReadBody  = errors.New("canon: reading body")
)

// tooLargeError reports a body longer than limit; it matches [ErrTooLarge].
type tooLargeError struct{ limit int64 }

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("canon: body too large: limit is %d bytes", e.limit)
}

func (e *tooLargeError) Unwrap() error { return ErrTooLarge }

func syntaxErr(off int, kind *cause, detail string) error {
	return &syntaxError{Offset: int64(off), Detail: detail, kind: kind}
}

// at returns e with its offset set.
func (e *syntaxError) at(off int) *syntaxError {
	e.Offset = int64(off)
	return e
}
