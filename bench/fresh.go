package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
)

// doFresh runs Do on a key never seen and expects it executed.
func doFresh(ctx context.Context, c *claim.Claimer[pgx.Tx], key string) (outcome, error) {
	out, err := c.Do(ctx, request(key), emptyWrite)
	if err != nil {
		return oOther, err
	}
	if out.Kind != claim.Executed {
		return oOther, fmt.Errorf("%w: fresh key answered %v", ErrUnexpected, out.Kind)
	}
	return oExecuted, nil
}

// freshWorkload: unique keys, claim → complete through Do with an empty
// business write, against the same two statements issued with pgx in one
// transaction.
func freshWorkload(e *env, f *floors) *workload {
	return &workload{
		name: "fresh",
		about: "unique keys, claim → complete in one transaction (Do, empty business write); " +
			"floor: the library's claim and completion statements issued with pgx in one transaction",
		variants: []*variant{
			{name: "library", vs: "floor-2stmt", target: 0.85,
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return doFresh(ctx, e.withRedis, r.key(i))
				}},
			{name: "library-no-redis", vs: "floor-2stmt",
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return doFresh(ctx, e.noRedis, r.key(i))
				}},
			{name: "floor-2stmt", floor: true,
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					return f.fresh(ctx, r.key(i))
				}},
		},
	}
}
