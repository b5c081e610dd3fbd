// Package claimtest proves, in a user's own unit tests and without servers,
// that the user's code is idempotent under oncekey: an HTTP handler behind
// [claimhttp.Middleware] (workflow or transaction mode), or a function run
// by [claim.Claimer.Do].
//
// It runs on the embedded default: a SQLite file in the test's temporary
// folder (package durable/sqlite) and an in-process Redis (miniredis), as
// the examples do when no server is named. [New] opens both; the code under
// test writes its own tables through [Env.DB] (in transaction mode, on the
// transaction claimhttp.Tx or Do's function gives it).
//
//	env := claimtest.New(t)
//	_, _ = env.DB.Exec(`CREATE TABLE orders (op_id TEXT PRIMARY KEY, item TEXT)`)
//	effects := func() int { var n int; _ = env.DB.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); return n }
//	env.CheckHTTP(t, createOrder, claimtest.Request{Path: "/orders", Body: `{"item":"book"}`},
//		effects, claimtest.WithInTransaction())
//
// # What is checked
//
// The caller says how to count its effects: effects returns how many times
// the effect happened so far (rows in its table, calls its fake downstream
// received). One request must add exactly one. Each window runs under a
// key of its own, and counts the effects it added:
//
//	window               forced by                                     passes when
//	concurrent           N requests with one key at once (N = 8,        one effect; every answer the same
//	                     WithDuplicates); in-progress answers retried   once final
//	dropped-response     the first answer is thrown away, the client   one effect; the retry replays the
//	                     retries with the same key                     first answer
//	crash-before-commit  the transaction does not commit: a panic      the crashed run left no effect; the
//	                     after the code under test returned, inside    retry runs again and leaves one;
//	                     the transaction (rolled back, as a process    the next retry replays it
//	                     dying before COMMIT leaves it)
//	panic-after-effect   workflow mode: a panic after the handler      one effect; the retry is answered
//	                     returned, before its result is recorded       202 uncertain, nothing runs again
//	mismatch             the same key with another payload             422 key-reused (claim.ErrMismatch);
//	                                                                   no effect beyond the first request's
//	redis-emptied        Redis flushed between the first answer and    one effect; the retry replays the
//	                     the retry                                     first answer (the durable record)
//
// crash-before-commit applies to transaction mode ([WithInTransaction],
// and every [Env.CheckDo]); panic-after-effect to workflow mode. The
// windows catch, for example, an effect made outside the transaction in
// transaction mode (it survives the crash, and the retry makes it again),
// a handler that calls claimhttp.ReleaseKey after its effect (the retry
// runs it again), and fingerprint options that leave out a member that
// changes the request (the other payload is replayed instead of refused).
// They do not exercise takeovers after a lease, store outages or Redis
// failovers: the library's own tests and chaos suite do.
//
// # Reports
//
// [Env.CheckHTTP] and [Env.CheckDo] report each failed window on the
// testing.TB with Errorf, as one readable account: the window, what was
// sent, what came back, the effects counted and expected, and why it
// failed. They return nil when every window passed, otherwise an error
// that matches [ErrNotIdempotent] (each window a [*WindowError]; [Failed]
// lists them) or, for a bad argument or option, [ErrConfig]. Accounts
// never hold an idempotency key: a request is named by its window and
// index, a key by a short hash.
package claimtest
