package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// orderAmount is the amount of every business row.
const orderAmount int64 = 4200

// orderWrite returns the business write of a fresh request: one INSERT of
// the order keyed by the request's key, in the transaction that holds the
// claim, and the result.
func orderWrite(e *env, key string) func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
	return func(ctx context.Context, tx pgx.Tx, _ claim.Op) (durable.Result, error) {
		if err := insertOrder(ctx, e, tx, key); err != nil {
			return durable.Result{}, err
		}
		return result, nil
	}
}

// doFresh runs Do with an empty business write on a key never seen and
// expects it executed (the other workloads' fresh requests).
func doFresh(ctx context.Context, c *claim.Claimer[pgx.Tx], key string) (outcome, error) {
	return doWith(ctx, c, key, emptyWrite)
}

// doOrder runs Do with the order INSERT as its business write on a key
// never seen and expects it executed (the fresh workload's requests).
func doOrder(ctx context.Context, e *env, c *claim.Claimer[pgx.Tx], key string) (outcome, error) {
	return doWith(ctx, c, key, orderWrite(e, key))
}

func doWith(ctx context.Context, c *claim.Claimer[pgx.Tx], key string, fn func(context.Context, pgx.Tx, claim.Op) (durable.Result, error)) (outcome, error) {
	out, err := c.Do(ctx, request(key), fn)
	if err != nil {
		return oOther, err
	}
	if out.Kind != claim.Executed {
		return oOther, fmt.Errorf("%w: fresh key answered %v", ErrUnexpected, out.Kind)
	}
	return oExecuted, nil
}

// freshWorkload: unique keys through Do, locking first (the default on
// PostgreSQL since issue 44: BEGIN with the key's lock and the record
// check, the business INSERT, the finished record with the COMMIT) and with
// the write at commit (claim.WithWriteAtCommit: the business INSERT, then
// the record inserted with the COMMIT), against Do's statements issued with
// pgx in one transaction (floor-lock-first, with Redis's scripts
// floor-lock-first-redis), the claim-first protocol's (the workflow's, and
// Do's before issue 44), and the business transaction alone (BEGIN, the
// INSERT, COMMIT); and issue 44's realistic business transaction through
// Do, through Claim and Lease.Complete, and alone (realistic.go).
func freshWorkload(e *env, f *floors) *workload {
	w := &workload{
		name: "fresh",
		about: "unique keys through Do, in one transaction: locking first (library, library-no-redis: BEGIN with the key's lock and the record check, " +
			"the business INSERT, the finished record with the COMMIT) and with WithWriteAtCommit (library-at-commit*: the business INSERT then the finished record with the COMMIT, no lock); " +
			"floors: Do's statements issued with pgx, BEGIN with the lock and the check in one round trip, the business INSERT, the record INSERT pipelined with COMMIT (floor-lock-first), " +
			"the same between the bare EVALSHAs Do sends when Redis answers, as captured from Do at start-up: claim.lua before, complete.lua after " +
			"(from a goroutine, not waited for, if Do sends it after its answer), and syncgen.lua from a goroutine once the BEGIN returned, if Do sends it (floor-lock-first-redis), " +
			"and on a table carried over by migration 007's contract step (the digest as the primary key: floor-lock-first-digest-key, against library*-digest-key); " +
			"the claim-first protocol (the workflow's Claim and Complete in one transaction; Do's before issue 44; its claims now take the key's lock too): " +
			"BEGIN, the claim, the business INSERT, the completion with COMMIT, " +
			"with the full claim (floor-claim-first) and with the insert sent for a key Redis granted (floor-claim-new); " +
			"floor-claim-new between the bare EVALSHAs of claim.lua and complete.lua (floor-claim-new-redis); " +
			"floor-claim-new's statements on issue 30.4's slim record, without the lock (bench/slim.go), with a B-tree on the expiry alone " +
			"(floor-slim-claim-first: HOT completions, no index for Pending) and with today's partial sweep and pending indexes " +
			"(floor-slim-pending-claim-first); " +
			"the write at commit's BEGIN and record INSERT (pipelined with COMMIT) and the business INSERT issued with pgx " +
			"(floor-sql); the same into a copy of the record's table with its primary key alone (floor-sql-pk-only); " +
			"the same with a bare 32-byte key row instead of the record (floor-key-row); " +
			"and BEGIN, the INSERT, COMMIT with no idempotency at all (floor-business-tx); " +
			"issue 44's realistic business transaction (an order with two lines, a stock UPDATE, a ledger INSERT: bench/realistic.go) " +
			"through Do with and without Redis (library-realistic, library-no-redis-realistic), through Claim, the transaction on its own " +
			"and Lease.Complete (library-claim-complete-realistic), and bare between BEGIN and COMMIT (floor-realistic-tx)",
		variants: []*variant{
			{name: "library", vs: "floor-lock-first", target: 0.90, open: true,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.9}, {floor: "floor-lock-first-redis"}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return doOrder(ctx, e, e.withRedis, r.key(i))
				}},
			{name: "library-no-redis", vs: "floor-lock-first", target: 0.90, open: true,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.7}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return doOrder(ctx, e, e.noRedis, r.key(i))
				}},
			{name: "library-digest-key", vs: "floor-lock-first-digest-key", target: 0.90,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.9}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return doOrder(ctx, e, e.digestKey, r.key(i))
				}},
			{name: "library-no-redis-digest-key", vs: "floor-lock-first-digest-key", target: 0.90,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.7}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return doOrder(ctx, e, e.digestKeyNoRedis, r.key(i))
				}},
			{name: "library-at-commit", vs: "floor-sql", target: 0.85,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.45}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return doOrder(ctx, e, e.atCommit, r.key(i))
				}},
			{name: "library-at-commit-no-redis", vs: "floor-sql",
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.3}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return doOrder(ctx, e, e.atCommitNoRedis, r.key(i))
				}},
			{name: "floor-lock-first", floor: true,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.5}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.lockFirst(ctx, &f.locked, r.key(i))
				}},
			{name: "floor-lock-first-redis", floor: true,
				costs: []costTarget{{floor: "floor-business-tx"}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.lockFirstRedis(ctx, r.key(i))
				}},
			{name: "floor-lock-first-digest-key", floor: true,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.5}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.lockFirst(ctx, &f.lockedDigestKey, r.key(i))
				}},
			{name: "floor-claim-first", floor: true,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.5}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.claimFirst(ctx, f.claimSQL, r.key(i))
				}},
			{name: "floor-claim-new", floor: true,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.5}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.claimFirst(ctx, f.claimNew, r.key(i))
				}},
			{name: "floor-claim-new-redis", floor: true,
				costs: []costTarget{{floor: "floor-business-tx"}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.claimNewRedis(ctx, r.key(i))
				}},
			{name: "floor-claim-in-begin", floor: true,
				costs: []costTarget{{floor: "floor-business-tx"}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.claimInBegin(ctx, r.key(i))
				}},
			{name: "floor-slim-claim-first", floor: true,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.5}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.slimClaimFirst(ctx, f.slim, r.key(i))
				}},
			{name: "floor-slim-pending-claim-first", floor: true,
				costs: []costTarget{{floor: "floor-business-tx", atMost: 1.5}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.slimClaimFirst(ctx, f.slimPend, r.key(i))
				}},
			{name: "floor-sql", floor: true, open: true,
				costs: []costTarget{{floor: "floor-business-tx"}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.fresh(ctx, r.key(i))
				}},
			{name: "floor-sql-pk-only", floor: true,
				costs: []costTarget{{floor: "floor-business-tx"}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.pkOnly(ctx, r.key(i))
				}},
			{name: "floor-key-row", floor: true,
				costs: []costTarget{{floor: "floor-business-tx"}},
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.keyRow(ctx, r.key(i))
				}},
			{name: "floor-business-tx", floor: true, open: true,
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.businessTx(ctx, r.key(i))
				}},
		},
	}
	// Issue 44: the realistic transaction's variants, alternated with the
	// others, its checks and the issue's targets.
	real, sides := realisticVariants(e, f)
	w.variants = append(w.variants, real...)
	w.finish = func(ctx context.Context) ([]extra, error) {
		book, err := readRealBook(ctx, e, sides)
		if err != nil {
			return nil, err
		}
		return append(issue44Targets(w.variants, e.cfg.concurrency), book.checks()...), nil
	}
	return w
}
