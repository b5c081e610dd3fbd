// Package testkit and the packages under it are the test harnesses that
// oncekey's modules share: the servers their tests find or start
// (testenv, redisproc, pgproxy), the contract suite of the stores
// (storetest) and the conformance suite of the entry points (entrytest,
// settletest, consumetest).
//
// They are for this repository's own tests, under the terms of package
// driver: not for applications, no compatibility promise, changed in any
// release. To test your own handler or fn, use claim/claimtest.
package testkit
