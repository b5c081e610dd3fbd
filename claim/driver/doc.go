// Package driver and the packages under it, with those under
// durable/driver, are the seam between oncekey's modules: what the adapter
// modules (claimgrpc, claimnats, claimamqp, claimriver) and the SQLite
// store module (durable/sqlite) use of the library that is not its API. In
// the manner of river's riverdriver:
//
//   - It is not for applications. Import claim, durable and their adapters;
//     nothing here is needed to use oncekey.
//   - It has no compatibility promise. Its names, types and behaviour change
//     in any release, minor or patch, without notice in the CHANGELOG.
//   - Do not implement its interfaces outside this repository. A module of
//     this repository is released with the library version it was built
//     with and requires exactly that version (RELEASING.md), so the seam
//     never meets another version of itself.
//
// The seam has two halves, each beside the package it extends, so the
// imports run one way: the entry points' half above claim, the stores'
// half below it.
//
// Above claim (claim/driver):
//
//   - driver (this one): this documentation. A Claimer's settings and its
//     transactional claim reach the adapters typed, through
//     [github.com/oncekey/oncekey/claim.Claimer.Driver] (claim's file
//     driver_seam.go, under the same terms as this tree).
//   - [github.com/oncekey/oncekey/claim/driver/settle]: the one settlement
//     engine every entry point runs its work under.
//   - [github.com/oncekey/oncekey/claim/driver/consume]: a message
//     consumer's run over the engine (claimnats, claimamqp, claimriver).
//   - [github.com/oncekey/oncekey/claim/driver/problem]: the problem+json
//     answers of the HTTP entry points.
//
// Below claim (durable/driver):
//
//   - [github.com/oncekey/oncekey/durable/driver/storeapi]: the claim
//     protocol a store implements (durable/postgres, durable/sqlite), with
//     [github.com/oncekey/oncekey/durable/driver/headers] and
//     [github.com/oncekey/oncekey/durable/driver/txmark], and
//     [github.com/oncekey/oncekey/durable/driver/storeopt], the option
//     checks both stores share.
//   - [github.com/oncekey/oncekey/durable/driver/wire]: the wire forms (the
//     Idempotency-Key header, stored results) the adapters share.
//   - [github.com/oncekey/oncekey/durable/driver/pgmigrate]: the migration
//     machinery of durable/postgres, which the operator CLI (cmd/oncekey)
//     runs too.
//
// The test harnesses the modules share live in testkit, under the same
// terms. Packages that only the library module uses stay in its internal
// folders; CI (go run ./internal/cmd/seams) fails when a module other than
// the library imports an internal package of another module.
package driver
