// Orders is an example HTTP service that creates orders exactly once per
// idempotency key, with package claimhttp in front of its handler.
//
//	go run ./examples/orders -demo                  # embedded: nothing to install
//	DATABASE_URL=postgres://... REDIS_URL=redis://... go run ./examples/orders -demo
//	go run ./examples/orders -addr 127.0.0.1:8080   # serve
//
// Routes:
//
//	POST /orders        {"item":"book","quantity":1}; needs Idempotency-Key
//	GET  /orders/{id}   one order of the caller
//	GET  /orders        the caller's orders
//
// POST /orders runs in the middleware's transaction mode
// (claimhttp.WithInTransaction): the order row is inserted in the same
// transaction that holds the claim and stores the response, so the order
// and its idempotency record commit together or not at all. A retry with
// the same key replays the stored 201 byte for byte, with
// "Idempotent-Replayed: true".
//
// The request is validated before the middleware sees it: a request that
// fails validation reserves nothing, so the client may fix it and send it
// again with the same key.
//
// # Services
//
// -postgres (default $DATABASE_URL) and -redis (default $REDIS_URL) name
// the servers to use. Each one not named is replaced by its embedded
// stand-in: a SQLite file under the OS temporary directory (or -data DIR)
// and an in-process Redis. The program prints which it runs on, never
// connects to a server that was not named, and creates its tables
// (idempotency_requests and example_orders) on start. -v logs at debug
// level (every Redis fallback) to stderr.
//
// # Demo authentication
//
// The tenant is read from "Authorization: Bearer <tenant>" as it is
// (package examples/internal/demoauth): the client says who it is and the
// service believes it. That is for the demo only. A real service verifies a credential in its authentication
// middleware and gives claimhttp the verified principal; the tenant must
// never come from a header the client controls.
//
// # The demo
//
// -demo starts the service on 127.0.0.1:0 and fires at itself: 20
// concurrent requests with one key, the key reused for another item, a
// request without a key, a response cut after the commit and retried by
// the client transport, and the first key from another tenant. It prints
// what happened, ends with the order counts, and exits 0 when every
// expectation held, 1 otherwise.
package main
