package main

import "errors"

var (
	// errNotFound is returned by an orderStore for an order that does not
	// exist for the caller.
	errNotFound = errors.New("orders: order not found")

	// errInvalidOrder is returned by orderRequest.validate; the message
	// says what is wrong.
	errInvalidOrder = errors.New("orders: invalid order")

	// errDemo is returned by the demo when an expectation failed.
	errDemo = errors.New("orders: demo expectations failed")
)
