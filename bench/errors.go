package main

import "errors"

var (
	// ErrConfig is returned for a bad flag value.
	ErrConfig = errors.New("bench: bad configuration")

	// ErrCheck is returned when a run violated a correctness check: a key
	// executed more than once, or requests failed.
	ErrCheck = errors.New("bench: correctness check failed")

	// ErrUnexpected is returned by a request whose outcome is not the one
	// its workload expects (a floor that found no row, a replay that did
	// not come from the cache); it counts as a failed request.
	ErrUnexpected = errors.New("bench: unexpected outcome")

	// ErrCapture is returned when the statements or the script SHA that a
	// floor copies from the library could not be captured.
	ErrCapture = errors.New("bench: could not capture the library's statements")
)
