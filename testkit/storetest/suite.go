package storetest

import (
	"context"
	"testing"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// Run runs the contract suite against the backend h describes. Every
// subtest gets its own store from h.New and runs in parallel with the
// others. It forces, at least: one winner among 64 concurrent claims;
// takeover only after the lease expired by the database's clock, with the
// old owner fenced; generation = GREATEST(proposed, stored+1), never
// decreasing across takeovers, releases, adoptions and retention restarts;
// ErrMismatch for another fingerprint; exact replay of completed and failed
// results; Release; retention restarts and Sweep in batches (processing and
// uncertain records kept and counted by Stats); isolation of tenants and
// operations; Claim and Complete inside InTx: commit and rollback, and a concurrent
// claimer blocked until commit; a claim in a transaction that does not
// acquire (NoLockUnlessAcquired) leaving its holder free to finish while
// the transaction is open; ErrUnavailable from an unreachable store;
// ErrInvalidScope with nothing written; a lost COMMIT acknowledgement
// resolved by reading; idempotent Complete; MarkUncertain, Adopt and
// Pending; an uncertain record released only by its adopter; Renew;
// Stats; a full retention after a late finish and after a takeover; response headers kept byte for byte; generations that rise
// across Sweep (a clock floor for created records, a clock margin for
// Sweep); a refused COMMIT reported as such, not as ErrUnavailable (with
// h.BreakCommit); a record read by its operation identity within its tenant
// only, and that identity given to rows that existed before migration 003
// (h.Upgrade); a handover of a claim by its token, exactly once; a
// workflow's steps recorded once in order under the token, replayed after
// a takeover, uncertain when left started unless repeatable, settled by the
// reconciler's token, and gone with a new operation; and, with
// h.Statements, one round trip per Claim and Complete.
//
// The sweep and generation subtests wait for the database's clock to pass a
// new record's generation by the sweep margin: about a minute, in parallel
// with the rest.
func Run[TTx any](t *testing.T, h Harness[TTx]) {
	if h.New == nil || h.Unreachable == nil || h.Upgrade == nil {
		t.Fatal("storetest: Harness.New, Harness.Unreachable and Harness.Upgrade are required")
	}
	if h.ExpectNew {
		h = withExpectNew(h)
	}
	c := &contract[TTx]{h: h}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ConcurrentClaimsAcquireExactlyOnce", c.concurrentClaims},
		{"TakeoverHappensOnlyAfterTheLeaseExpired", c.takeover},
		{"GenerationIsTheGreaterOfProposedAndStoredPlusOne", c.proposedGeneration},
		{"DifferentFingerprintIsAMismatch", c.mismatch},
		{"FinishedRecordReplaysTheStoredResult", c.replay},
		{"FailedRecordReplaysAndCannotBeCompleted", c.failReplay},
		{"CompletingTwiceWithTheSameTokenSucceeds", c.completeTwice},
		{"ReleaseFreesTheKeyAndFencesTheReleasedOwner", c.release},
		{"RecordPastRetentionIsANewOperation", c.retentionRestart},
		{"SweepDeletesOnlyFinishedExpiredRecordsInBatchesAndGenerationsRiseAcrossIt", c.sweep},
		{"TenantsAndOperationsNeverInteract", c.isolation},
		{"ClaimAndCompleteInTheCallersTransaction", c.inTx},
		{"ClaimInTxBlocksAConcurrentClaimerUntilCommit", c.claimTxBlocks},
		{"ClaimInTxRollbackLetsTheBlockedClaimerAcquire", c.claimTxRollback},
		{"ClaimInTxThatDoesNotAcquireLeavesTheHolderFreeToFinish", c.claimTxRefusedHoldsNothing},
		{"UnreachableStoreReturnsErrUnavailable", c.unreachable},
		{"InvalidParametersReturnErrInvalidScopeAndWriteNothing", c.invalid},
		{"LostCommitAckIsResolvedByReadingTheRecord", c.lostCommitAck},
		{"GenerationNeverDecreases", c.monotonic},
		{"UncertainRecordIsAdoptedAndCompletedByTheAdopter", c.uncertain},
		{"UncertainRecordIsReleasedOnlyByItsAdopter", c.uncertainRelease},
		{"AdoptingALiveLeaseIsBusy", c.adoptBusy},
		{"PendingSelectsStaleProcessingAndFreeUncertainRecords", c.pending},
		{"RenewExtendsOnlyTheOwnersLease", c.renew},
		{"StatsCountRecordsByState", c.stats},
		{"ClaimAndCompleteTakeOneRoundTripEach", c.roundTrips},
		{"RecordFinishedAfterItsRetentionKeepsAFullRetention", c.finishAfterRetention},
		{"TakeoverRaisesExpiryToAFullRetention", c.takeoverRetention},
		{"HeadersAreStoredByteForByte", c.headersExact},
		{"DefiniteCommitFailureIsNotReportedAsUnavailable", c.definiteCommitFailure},
		{"OperationIsReadByItsIdentityWithinItsTenantOnly", c.operationByID},
		{"MigrationGivesExistingRowsTheirOperationIdentity", c.operationMigration},
		{"HandoverMovesAClaimOnOnceFromItsToken", c.handover},
		{"StepsAreRecordedOnceInOrderUnderTheToken", c.stepsRecord},
		{"StepsAfterATakeoverReplayFenceAndTurnUncertain", c.stepsTakeover},
		{"UnfinishedStepIsSettledAndTheWorkResumes", c.stepsSettle},
		{"NewOperationStartsWithoutSteps", c.stepsNewLife},
		{"InvalidStepArgumentsWriteNothing", c.stepsInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

type contract[TTx any] struct{ h Harness[TTx] }

// fresh returns a new store, a context for the test, a fresh scope and its
// ref.
func (c *contract[TTx]) fresh(t *testing.T) (storeapi.Store[TTx], context.Context, durable.Scope, durable.Ref) {
	t.Helper()
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	return s, ctx, sc, mustRef(t, s, sc)
}

type outcome struct {
	res storeapi.ClaimResult
	err error
}
