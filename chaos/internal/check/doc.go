// Package check is the chaos suite's checker. It reads what the clients saw
// (package history's calls), the business effects the scenario wrote to a
// table without a unique constraint, samples of the durable generations
// and the final records read with plain SQL, and reports every broken
// invariant. It does not consult the library's own bookkeeping (its
// metrics, its return values beyond what a client saw), so a bug that the
// library does not know about still shows.
//
// The invariants (each a [Violation.Invariant]):
//
//   - [AtMostOneEffect]: at most one business effect per logical operation.
//   - [AckedOneEffect]: an operation acknowledged as a success has exactly
//     one effect, whose result is the one acknowledged; a stored business
//     rejection has none.
//   - [ReplaysIdentical]: all answers of one operation are byte-identical.
//   - [GenerationMonotonic]: a durable generation never decreases.
//   - [OneOwnerPerGeneration]: no two owners ever held or completed under one
//     generation.
//   - [NoStaleCompletion]: no completion accepted from a token after a
//     higher generation was granted.
//   - [Linearizable]: porcupine finds one sequential execution of a
//     per-operation model of the record that explains every call, timed-out
//     calls given an open end so that both their outcomes are explored.
//   - [AckedDurable]: no acknowledged result lost.
//   - [StuckReported]: processing and uncertain records past retention are
//     reported by Stats and never deleted.
//   - [RetentionNewOperation]: after the retention window, a retried key is a
//     new operation, as documented.
//   - [FinishedNotInProgress]: a call sent after its operation finished (a
//     completion or failure acknowledged, or a result replayed, before the
//     call started: real-time order on the recorder's clock) is never
//     answered "in progress" or "uncertain".
//   - [OneRunAtATime]: two runs of Do's business function for one
//     operation, both meant to hold the key's lock (Do without
//     WithWriteAtCommit), never overlap: none starts while another runs
//     whose transaction lived through it, as its commit (its effect in
//     the table) or its call's answer shows (real-time order on the
//     recorder's clock; a run whose session may have ended early, taking
//     the lock with it, is no witness).
//
// A checker that cannot fail proves nothing: the suite runs the same
// scenarios against a deliberately broken store and expects violations.
package check
