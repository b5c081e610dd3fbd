package canon

import (
	"errors"
	"fmt"
	"strconv"
)

// The sentinels below classify every error this package returns. An HTTP
// layer needs only three branches:
//
//   - errors.Is(err, ErrTooLarge): 413 Content Too Large;
//   - errors.Is(err, ErrInvalidOptions): a server misconfiguration (500);
//   - anything else returned by [Request]: the request itself is not
//     fingerprintable, 400 Bad Request.
//
// Every error from [JSON] for input that is not RFC 8785 JSON is a
// [*SyntaxError] and matches [ErrInvalidJSON] as well as its specific
// sentinel. [ErrPrecision] is a *SyntaxError too, but it does not match
// ErrInvalidJSON: the input is valid JSON, rejected by the fingerprinting
// policy.
var (
	// ErrInvalidJSON matches every error for input that cannot be
	// canonicalized under RFC 8785: malformed syntax, and each of
	// ErrInvalidUTF8, ErrLoneSurrogate, ErrDuplicateKey, ErrNumberOverflow
	// and ErrTooDeep. A plain syntax error has it as its specific sentinel.
	ErrInvalidJSON = errors.New("canon: invalid JSON")

	// ErrInvalidUTF8 is returned for a byte sequence in a string that is not
	// well-formed UTF-8 (including UTF-8-encoded surrogates and overlong
	// forms).
	ErrInvalidUTF8 = errors.New("canon: invalid UTF-8")

	// ErrLoneSurrogate is returned for a \u escape of a UTF-16 surrogate that
	// is not part of a high-low pair.
	ErrLoneSurrogate = errors.New("canon: lone surrogate in \\u escape")

	// ErrDuplicateKey is returned for an object with two members of the same
	// name (compared after unescaping, as RFC 8785 requires).
	ErrDuplicateKey = errors.New("canon: duplicate member name")

	// ErrNumberOverflow is returned for a number whose magnitude rounds past
	// the largest finite IEEE-754 double (for example 1E400). A number too
	// small for a double rounds to zero, as in ECMAScript, and is not an
	// error.
	ErrNumberOverflow = errors.New("canon: number overflows a double")

	// ErrTooDeep is returned for arrays and objects nested more than
	// [MaxDepth] levels deep.
	ErrTooDeep = errors.New("canon: nesting too deep")

	// ErrPrecision is returned on the fingerprinting path ([Request],
	// [JSONStrict]) for a plain integer literal that a double cannot hold
	// exactly, such as 9007199254740993: RFC 8785 would round it and merge it
	// with a different integer. Clients send such values as strings.
	// [Options.AllowImpreciseNumbers] turns the check off.
	ErrPrecision = errors.New("canon: integer literal exceeds double precision")

	// ErrTooLarge is returned by [Request] for a body longer than
	// [Options.MaxBody], detected without reading past the limit. The
	// concrete error is a [*TooLargeError].
	ErrTooLarge = errors.New("canon: body too large")

	// ErrInvalidForm is returned by [Request] for an
	// application/x-www-form-urlencoded body that does not parse (a bad
	// percent escape, or a semicolon separator).
	ErrInvalidForm = errors.New("canon: invalid form body")

	// ErrInvalidQuery is returned by [Request] for a URL query that does not
	// parse (a bad percent escape, or a semicolon separator). Parameters are
	// never dropped silently: two queries that differ only in a malformed
	// pair would otherwise share a fingerprint.
	ErrInvalidQuery = errors.New("canon: invalid query")

	// ErrReadBody wraps an error returned while reading the request body
	// (typically the client went away).
	ErrReadBody = errors.New("canon: reading body")

	// ErrInvalidOptions is returned by [Request] for an [Options] value that
	// is unusable: a negative MaxBody, an empty or malformed header name, or
	// an Exclude entry that is not an RFC 6901 JSON Pointer to a member. It
	// is a programming error, not a client error.
	ErrInvalidOptions = errors.New("canon: invalid options")
)

// SyntaxError reports input that [JSON] cannot canonicalize, with the byte
// offset where the problem was found. Err is the specific sentinel
// (ErrInvalidJSON for a plain syntax error, or ErrInvalidUTF8,
// ErrLoneSurrogate, ErrDuplicateKey, ErrNumberOverflow, ErrTooDeep,
// ErrPrecision); errors.Is matches it, and also ErrInvalidJSON unless Err is
// ErrPrecision.
//
// The message never quotes the input: bodies may carry personal data and
// error strings end up in logs.
type SyntaxError struct {
	Offset int64  // byte offset into the input
	Err    error  // the specific sentinel
	Detail string // a fixed description, such as "expected ':'"
}

func (e *SyntaxError) Error() string {
	msg := e.Err.Error()
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg + " at offset " + strconv.FormatInt(e.Offset, 10)
}

// Unwrap returns the specific sentinel.
func (e *SyntaxError) Unwrap() error { return e.Err }

// Is reports whether target is ErrInvalidJSON and the error is not a
// precision rejection (which concerns valid JSON).
func (e *SyntaxError) Is(target error) bool {
	return target == ErrInvalidJSON && e.Err != ErrPrecision
}

// TooLargeError reports a request body longer than the configured limit. It
// matches [ErrTooLarge] with errors.Is.
type TooLargeError struct {
	Limit int64 // the limit in bytes that was exceeded
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("canon: body too large: limit is %d bytes", e.Limit)
}

// Is reports whether target is ErrTooLarge.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

func syntaxErr(off int, kind error, detail string) error {
	return &SyntaxError{Offset: int64(off), Err: kind, Detail: detail}
}

// at returns e with its offset set.
func (e *SyntaxError) at(off int) *SyntaxError {
	e.Offset = int64(off)
	return e
}
