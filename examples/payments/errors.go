package main

import "errors"

var (
	// errOutcomeUnknown is returned by gatewayClient.charge when the
	// gateway may have charged but did not say so (a timeout, a lost
	// connection). The operation is marked uncertain, never retried blind.
	errOutcomeUnknown = errors.New("payments: gateway outcome unknown")

	// errNotCharged is returned by gatewayClient.charge when the gateway
	// certainly charged nothing: it was not reached, or it refused.
	errNotCharged = errors.New("payments: gateway did not charge")

	// errInvalidPayment is returned by paymentRequest.validate; the
	// message says what is wrong.
	errInvalidPayment = errors.New("payments: invalid payment")

	// errUsage is returned for a bad command line.
	errUsage = errors.New("payments: usage")

	// errDemo is returned by the demo when an expectation failed.
	errDemo = errors.New("payments: demo expectations failed")
)
