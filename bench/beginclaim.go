package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// claimInBeginFunc is the function floor-claim-in-begin calls from the
// query that opens the transaction: floor-claim-new's insert (the library's
// claimNewSQL, captured, so $1-$9 are the function's arguments), whose plan
// PL/pgSQL prepares once per connection, raising unique_violation unless
// it inserted the record at the proposed generation ($5). The caller then
// knows its generation without reading a reply: pgx discards the results
// of the query that opens a transaction. %s is the schema, %q the insert.
const claimInBeginFunc = `CREATE FUNCTION %s.claim_in_begin(text, text, bytea, text, bigint, uuid, bigint, bigint, bytea)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE g bigint;
BEGIN
	%s INTO g;
	IF g IS DISTINCT FROM $5 THEN
		RAISE EXCEPTION 'the scope has a record' USING ERRCODE = 'unique_violation';
	END IF;
END
$fn$`

// createClaimInBegin creates claimInBeginFunc in the run's schema.
func (f *floors) createClaimInBegin(ctx context.Context) error {
	if !strings.Contains(f.claimNew, "RETURNING generation") {
		return fmt.Errorf("%w: the insert claim does not return its generation", ErrCapture)
	}
	_, err := f.e.pool.Exec(ctx, fmt.Sprintf(claimInBeginFunc, f.e.schema, f.claimNew))
	return err
}

// claimInBegin is floor-claim-new with the claim sent in the query that
// opens the transaction (one round trip fewer): the library's BEGIN, then
// SELECT claim_in_begin(...) with the arguments as literals (hex-encoded,
// so nothing in them can be read as SQL), in pgx's BeginTx; the order
// INSERT; the completion and COMMIT in one pipeline. The generation is the
// one proposed, as Do proposes without Redis (the client's clock less
// 30 s), which the function checks. What it measures is whether one round
// trip fewer pays for a function call and planning the SELECT each time;
// inlining the INSERT itself did not (bench/README.md).
func (f *floors) claimInBegin(ctx context.Context, key string) (outcome, error) {
	h := sha256.Sum256([]byte(key))
	owner := uuid.New()
	gen := time.Now().Add(-30 * time.Second).UnixMilli()
	begin := fmt.Sprintf("%s; SELECT %s.claim_in_begin(convert_from('\\x%x'::bytea, 'UTF8'), convert_from('\\x%x'::bytea, 'UTF8'), '\\x%x'::bytea, convert_from('\\x%x'::bytea, 'UTF8'), %d::bigint, '%s'::uuid, %d::bigint, %d::bigint, '\\x%x'::bytea)",
		f.beginSQL, f.e.schema, tenant, operation, h[:], fingerprint, gen, owner, leaseUs, retentionUs, h[:])
	return f.claimThenComplete(ctx, key, begin, func(pgx.Tx) (int64, error) { return gen, nil },
		func(gen int64) (string, []any) { return f.finishSQL, f.finishArgs(h[:], gen, owner) })
}
