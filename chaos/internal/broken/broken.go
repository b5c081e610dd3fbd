// Package broken is the chaos suite's negative control: a durable store
// with a deliberate bug, so the suite can show that its checker reports
// the violations such a bug causes. A checker that cannot fail proves
// nothing. It is internal to the chaos suite: nothing else can build it.
package broken

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// Mode is the bug the store has.
type Mode string

const (
	// CompleteWithoutFence writes completions with plain SQL that does
	// not check the owner, the generation or the state: a stale owner's
	// completion is accepted.
	CompleteWithoutFence Mode = "complete-without-fence"
	// ClaimTrustsRedis claims by overwriting the record unconditionally
	// with the generation Redis proposed: Redis is trusted as the
	// guarantee, so a finished operation runs again whenever Redis does
	// not answer it, and generations repeat when Redis lost data.
	ClaimTrustsRedis Mode = "claim-trusts-redis"
	// ReleaseAfterStart gives the key back once work started under a
	// lease, as the middleware did before the workflow rule: MarkUncertain
	// releases the record instead, and a Renew, Complete or Fail that
	// could not be written (anything but fenced) releases it too. A retry
	// then runs the operation again although its effect may have
	// happened. Transactions (the Tx methods) are untouched: releasing
	// there is safe.
	ReleaseAfterStart Mode = "release-after-start"
	// NoRereadAfterLostAck takes a write whose acknowledgement was lost
	// as not applied, without re-reading the record: a COMMIT whose reply
	// was lost is reported as refused (rolled back), and a fenced Complete
	// or Fail whose reply was lost as fenced. The caller then believes
	// the opposite of what the database holds.
	NoRereadAfterLostAck Mode = "no-reread-after-lost-ack"
	// WorkerClockLease sets and compares leases with the worker's clock
	// (see [WorkerClock]) instead of the database's: a claim takes over a
	// record whose lease the worker's clock says has run out, and a claim
	// or a renewal sets the lease to the worker's clock plus its length.
	// With worker clocks hours apart, live leases are taken over.
	WorkerClockLease Mode = "worker-clock-lease"
	// CommitOverExisting writes Do's record at commit with INSERT ... ON
	// CONFLICT DO NOTHING and commits anyway: a request whose record
	// exists (finished, or held by another request) commits its business
	// write a second time when the fast path let it through (Redis lost
	// the key). Under every other mode the store does not write records
	// at commit, so Do claims first and meets that mode's bug.
	CommitOverExisting Mode = "commit-over-existing"
	// UnresolvedStaysProcessing leaves a record the Reconciler adopted
	// from a dead worker processing when the application could not
	// resolve it, as the Reconciler did before issue 27 #9: MarkUncertain
	// under a token Adopt handed out for a processing record writes
	// nothing and succeeds. Once the adopted lease runs out, a retry takes
	// the record over and runs the work again, although its effect may
	// have happened.
	UnresolvedStaysProcessing Mode = "unresolved-stays-processing"
	// ExpiresInInflated reports a live record's remaining life
	// (Record.ExpiresIn, from a claim or a read) an hour longer than it
	// is. Nothing the database decides changes (a record still expires
	// and is swept on time); what the Claimer derives from it does: the
	// replay cache in process (claim.WithReplayCache) and Redis's refilled
	// copies keep a result past its record, and answer a retry that should
	// have started the key's next life with the previous life's result.
	ExpiresInInflated Mode = "expires-in-inflated"
	// ReplayIgnoresFingerprint answers a claim that found a finished
	// record of another request (a key reused with another payload) with
	// that record as if it were the caller's own: the reused key is
	// answered with the first payload's result instead of a mismatch, and
	// the Claimer caches it in Redis under the second payload's
	// fingerprint. Reads (Get) are untouched, so a Claimer that reads
	// first still compares fingerprints itself.
	ReplayIgnoresFingerprint Mode = "replay-ignores-fingerprint"
	// DoSkipsLock passes Do's write at commit on with LockFirst unset: the
	// transaction neither takes the key's lock nor checks that no record
	// exists before fn runs, as Do ran before issue 44 (and as the
	// WithWriteAtCommit opt-in still runs). A duplicate that reaches the
	// database while the holder's fn runs (Redis down, or it lost the key)
	// runs fn beside it; its insert at commit then waits for the holder's
	// and fails, rolling fn's writes back, so the record, the effects and
	// every answer stay right: only the two runs at once show.
	DoSkipsLock Mode = "do-skips-lock"
	// TrustLease gives every Claimer lua.Options.TrustLease of a whole
	// lease: a duplicate that meets a confirmed Redis lease is answered
	// "in progress" by Redis alone for as long as it lives, as before the
	// opt-in existed. A split brain that kept a holder's lease on one side
	// and its completion on the other then tells retries of finished work
	// "in progress". The store and the library are the real ones; only the
	// configuration differs.
	TrustLease Mode = "trust-lease"
)

// inflation is how much longer than it is [ExpiresInInflated] reports a
// live record's remaining life.
const inflation = time.Hour

// Modes lists every mode.
func Modes() []Mode {
	return []Mode{CompleteWithoutFence, ClaimTrustsRedis, ReleaseAfterStart, NoRereadAfterLostAck, WorkerClockLease, CommitOverExisting,
		OneAttempt, ReleaseOnError, NoRecover, UnresolvedStaysProcessing, ExpiresInInflated, ReplayIgnoresFingerprint, RetryTakesLease, DoSkipsLock, TrustLease}
}

// Breaks says, in a line, what the mode breaks.
func (m Mode) Breaks() string {
	switch m {
	case CompleteWithoutFence:
		return "completions without the fence: a stale owner's completion is accepted"
	case ClaimTrustsRedis:
		return "claims trust Redis's proposal and overwrite the record"
	case ReleaseAfterStart:
		return "the key given back after work started: MarkUncertain releases, so does a renewal or finish that could not be written"
	case NoRereadAfterLostAck:
		return "a COMMIT or fenced finish whose reply was lost is taken as not applied, without re-reading"
	case WorkerClockLease:
		return "leases set and compared by the worker's clock instead of the database's"
	case CommitOverExisting:
		return "Do's record inserted at commit over an existing one (ON CONFLICT DO NOTHING), committing the business write anyway"
	case UnresolvedStaysProcessing:
		return "a dead worker's record the Reconciler could not resolve left processing under the adopted lease, not marked uncertain"
	case ExpiresInInflated:
		return "a live record's remaining life (ExpiresIn) reported an hour longer than it is: caches keep its result past the record"
	case ReplayIgnoresFingerprint:
		return "a finished record of another payload answered as the caller's own: a reused key replays the first payload's result"
	case DoSkipsLock:
		return "Do's transaction runs fn without the key's lock and the check for a record: a duplicate runs fn beside the holder (its writes then rolled back)"
	case RetryTakesLease:
		return "a replaying retry takes a Redis lease: claim.lua's leases confirmed at once, so retries of a finished operation beside it are told in progress"
	case TrustLease:
		return "Redis leases trusted for their whole length: a duplicate that meets one is told in progress without reading the record, even when Redis lost the completion"
	case OneAttempt:
		return "the settlement engine stops the lease and tries the finishing write once"
	case ReleaseOnError:
		return "the settlement engine releases the key for every outcome but a completion"
	case NoRecover:
		return "the settlement engine neither recovers a panic nor stops the renewals after one"
	}
	return ""
}

// ErrUnknownMode is returned by [Wrap] for an unknown mode.
var ErrUnknownMode = errors.New("broken: unknown mode")

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Store is a PostgreSQL store with one deliberate bug; every method the bug
// does not touch is the wrapped store's.
type Store struct {
	storeapi.Store[pgx.Tx]        // the real store, or a fault layer over it (Over)
	table                  string // the store's table, schema-qualified
	pool                   *pgxpool.Pool
	mode                   Mode
	now                    func() time.Time
	adopted                sync.Map // fence.Token -> struct{}: Adopt's tokens for processing records (UnresolvedStaysProcessing)
	onSkip                 func()   // called for each lock DoSkipsLock skipped
}

var (
	_ storeapi.Store[pgx.Tx]        = (*Store)(nil)
	_ storeapi.CommitWriter[pgx.Tx] = (*Store)(nil)
)

// Option adjusts [Wrap].
type Option func(*Store)

// Over makes the store call inner, instead of the PostgreSQL store itself,
// for everything its bug does not replace: a fault layer between the bug
// and the database (inner must run on the same database and schema).
func Over(inner storeapi.Store[pgx.Tx]) Option {
	return func(s *Store) {
		if inner != nil {
			s.Store = inner
		}
	}
}

// WorkerClock is the worker's clock that [WorkerClockLease] measures leases
// with. Defaults to time.Now.
func WorkerClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// OnLockSkipped makes [DoSkipsLock] call f each time it drops the lock a
// write at commit asked for (ClaimParams.LockFirst): the Claimer took Do's
// default path, and the bug was met.
func OnLockSkipped(f func()) Option {
	return func(s *Store) { s.onSkip = f }
}

// Wrap returns s, which runs on pool with its records in table (as written
// in statements: schema-qualified), with the bug of mode.
func Wrap(s storeapi.Store[pgx.Tx], pool *pgxpool.Pool, table string, mode Mode, opts ...Option) (*Store, error) {
	for _, m := range Modes() {
		if m == mode {
			b := &Store{Store: s, table: table, pool: pool, mode: mode, now: time.Now}
			for _, o := range opts {
				o(b)
			}
			return b, nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownMode, mode)
}

// Claim is the real claim, or with ClaimTrustsRedis an unconditional
// overwrite; inside tx when tx is not nil.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	var q querier = s.pool
	if tx != nil {
		q = tx
	}
	switch s.mode {
	case ClaimTrustsRedis:
		return s.claim(ctx, q, p)
	case WorkerClockLease:
		return s.clockClaim(ctx, q, p, func() (storeapi.ClaimResult, error) { return s.Store.Claim(ctx, tx, p) })
	case ExpiresInInflated:
		res, err := s.Store.Claim(ctx, tx, p)
		if res.Record != nil {
			rec := *res.Record
			res.Record = &rec
			inflate(&rec)
		}
		return res, err
	case ReplayIgnoresFingerprint:
		res, err := s.Store.Claim(ctx, tx, p)
		if errors.Is(err, durable.ErrMismatch) && res.Record != nil && res.Record.State.Finished() {
			rec := *res.Record
			rec.Fingerprint = p.Fingerprint
			res.Record = &rec
			return res, nil
		}
		return res, err
	}
	return s.Store.Claim(ctx, tx, p)
}

// Get is the real read; with ExpiresInInflated a live record's remaining
// life is reported an hour longer.
func (s *Store) Get(ctx context.Context, ref durable.Ref) (durable.Record, error) {
	rec, err := s.Store.Get(ctx, ref)
	if s.mode == ExpiresInInflated && err == nil {
		inflate(&rec)
	}
	return rec, err
}

// Operation is the real read; with ExpiresInInflated as Get.
func (s *Store) Operation(ctx context.Context, tenant string, digest [32]byte) (durable.Record, error) {
	rec, err := s.Store.Operation(ctx, tenant, digest)
	if s.mode == ExpiresInInflated && err == nil {
		inflate(&rec)
	}
	return rec, err
}

// inflate is the bug of [ExpiresInInflated]: a live record (time left) is
// reported to live an hour longer. An expired one is left as it is, so
// whether a record replays at all is still the database's word; only how
// long a copy of it may be kept is wrong.
func inflate(rec *durable.Record) {
	if rec.ExpiresIn > 0 {
		rec.ExpiresIn += inflation
	}
}

func (s *Store) claim(ctx context.Context, q querier, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	if err := p.Validate(); err != nil {
		return storeapi.ClaimResult{}, err
	}
	ref, err := s.Store.Ref(p.Scope)
	if err != nil {
		return storeapi.ClaimResult{}, err
	}
	var gen int64
	err = q.QueryRow(ctx, `INSERT INTO `+s.table+` (tenant_id, operation, key_hash, request_hash, state, generation,
		owner_token, lease_expires_at, takeovers, created_at, expires_at)
	VALUES ($1, $2, $3, $4, 'processing', GREATEST($5::bigint, 1), $6, clock_timestamp() + $7::bigint * interval '1 microsecond', 0,
		clock_timestamp(), clock_timestamp() + $8::bigint * interval '1 microsecond')
	ON CONFLICT (tenant_id, operation, key_hash) DO UPDATE SET
		generation = EXCLUDED.generation, owner_token = EXCLUDED.owner_token,
		lease_expires_at = EXCLUDED.lease_expires_at, request_hash = EXCLUDED.request_hash, state = 'processing',
		status_code = NULL, response_headers = NULL, response_body = NULL, response_version = NULL,
		resource_id = NULL, completed_at = NULL
	RETURNING generation`,
		ref.Tenant, ref.Operation, ref.KeyHash[:], p.Fingerprint, int64(p.Proposed), p.Owner,
		p.Lease.Microseconds(), p.Retention.Microseconds()).Scan(&gen)
	if err != nil {
		return storeapi.ClaimResult{}, fmt.Errorf("broken: claim: %w: %w", durable.ErrUnavailable, err)
	}
	return storeapi.ClaimResult{Acquired: true, Ref: ref, Token: fence.Token{Generation: uint64(gen), Owner: p.Owner}}, nil
}

// Complete is the real completion, or with CompleteWithoutFence one that
// writes whatever token asks; with NoRereadAfterLostAck one that takes a
// lost reply as fenced; with ReleaseAfterStart one that releases the
// record when it could not be written. Inside tx (not nil) only
// CompleteWithoutFence changes it.
func (s *Store) Complete(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if tx != nil {
		if s.mode != CompleteWithoutFence {
			return s.Store.Complete(ctx, tx, ref, tok, res)
		}
		return s.complete(ctx, tx, ref, res)
	}
	switch s.mode {
	case CompleteWithoutFence:
		return s.complete(ctx, s.pool, ref, res)
	case NoRereadAfterLostAck:
		return s.finishNoReread(ctx, durable.Completed, ref, tok, res)
	case ReleaseAfterStart:
		return s.releaseOnError(ctx, ref, tok, s.Store.Complete(ctx, nil, ref, tok, res))
	}
	return s.Store.Complete(ctx, nil, ref, tok, res)
}

// Fail is the real one, but for NoRereadAfterLostAck and
// ReleaseAfterStart as in Complete (on its own; inside tx the real one).
func (s *Store) Fail(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if tx != nil {
		return s.Store.Fail(ctx, tx, ref, tok, res)
	}
	switch s.mode {
	case NoRereadAfterLostAck:
		return s.finishNoReread(ctx, durable.Failed, ref, tok, res)
	case ReleaseAfterStart:
		return s.releaseOnError(ctx, ref, tok, s.Store.Fail(ctx, nil, ref, tok, res))
	}
	return s.Store.Fail(ctx, nil, ref, tok, res)
}

// MarkUncertain is the real one, or with ReleaseAfterStart a release: the
// outcome was unknown, and the key is given back anyway. With
// UnresolvedStaysProcessing it writes nothing for a token Adopt handed out
// for a processing record: the record stays processing under that lease.
func (s *Store) MarkUncertain(ctx context.Context, ref durable.Ref, tok fence.Token) error {
	switch s.mode {
	case ReleaseAfterStart:
		return s.Store.Release(ctx, nil, ref, tok)
	case UnresolvedStaysProcessing:
		if _, ok := s.adopted.Load(tok); ok {
			return nil // the bug: left processing, runnable once the lease runs out
		}
	}
	return s.Store.MarkUncertain(ctx, ref, tok)
}

// Adopt is the real one; with UnresolvedStaysProcessing it remembers the
// token it hands out for a processing record (read just before: a record
// adopted between the read and the adoption is not remembered, and is
// marked uncertain as it should be).
func (s *Store) Adopt(ctx context.Context, ref durable.Ref, owner uuid.UUID, proposed uint64, lease time.Duration) (fence.Token, error) {
	if s.mode != UnresolvedStaysProcessing {
		return s.Store.Adopt(ctx, ref, owner, proposed, lease)
	}
	rec, err := s.Store.Get(ctx, ref)
	if err != nil {
		return fence.Token{}, err
	}
	tok, err := s.Store.Adopt(ctx, ref, owner, proposed, lease)
	if err == nil && rec.State == durable.Processing {
		s.adopted.Store(tok, struct{}{})
	}
	return tok, err
}

// Renew is the real renewal; with ReleaseAfterStart a renewal that could
// not be written releases the record, and with WorkerClockLease a renewal
// sets the lease by the worker's clock.
func (s *Store) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	err := s.Store.Renew(ctx, ref, tok, lease)
	switch s.mode {
	case ReleaseAfterStart:
		return s.releaseOnError(ctx, ref, tok, err)
	case WorkerClockLease:
		if err == nil {
			err = s.setLease(ctx, s.pool, ref, tok, lease)
		}
	}
	return err
}

// InTx is the real one; with NoRereadAfterLostAck a COMMIT whose outcome is
// unknown is reported as refused: rolled back, nothing committed.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if s.mode != NoRereadAfterLostAck {
		return s.Store.InTx(ctx, fn)
	}
	ran := false
	err := s.Store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		err := fn(ctx, tx)
		ran = err == nil
		return err
	})
	if err != nil && ran && errors.Is(err, durable.ErrUnavailable) {
		// The bug: the outcome is unknown, the record is not re-read.
		return fmt.Errorf("broken: commit refused, transaction rolled back (its reply was lost; not re-read): %v", err)
	}
	return err
}

// InsertAtCommit is, with CommitOverExisting, a write at commit whose
// insert does not stop at an existing record; with DoSkipsLock the real
// one (the wrapped store's, when it writes at commit) with LockFirst
// unset. Under every other mode it writes nothing and returns
// ErrNotInserted without running fn, so Do claims first, through that
// mode's bug.
func (s *Store) InsertAtCommit(ctx context.Context, p storeapi.ClaimParams, tok fence.Token, fn func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error)) error {
	switch s.mode {
	case CommitOverExisting:
	case DoSkipsLock:
		cw, ok := s.Store.(storeapi.CommitWriter[pgx.Tx])
		if !ok {
			return storeapi.ErrNotInserted
		}
		if p.LockFirst && s.onSkip != nil {
			s.onSkip()
		}
		p.LockFirst = false // the bug: fn runs without the key's lock, beside any duplicate
		return cw.InsertAtCommit(ctx, p, tok, fn)
	default:
		return storeapi.ErrNotInserted
	}
	ref, err := s.Store.Ref(p.Scope)
	if err != nil {
		return err
	}
	return s.Store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		state, res, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		headers, body, err := encode(res)
		if err != nil {
			return err
		}
		// The bug: an existing record does not stop the COMMIT.
		_, err = tx.Exec(ctx, `INSERT INTO `+s.table+` (tenant_id, operation, key_hash, request_hash, state, generation,
			owner_token, status_code, response_headers, response_body, response_version, resource_id, takeovers,
			created_at, completed_at, expires_at, retention_us)
		VALUES ($1, $2, $3, $4, '`+string(state)+`', $5, $6, $7, $8::jsonb, $9, $10, $11, 0,
			clock_timestamp(), clock_timestamp(), clock_timestamp() + $12::bigint * interval '1 microsecond', $12)
		ON CONFLICT (tenant_id, operation, key_hash) DO NOTHING`,
			ref.Tenant, ref.Operation, ref.KeyHash[:], p.Fingerprint, int64(tok.Generation), tok.Owner,
			res.StatusCode, headers, body, res.Version, res.ResourceID, p.Retention.Microseconds())
		if err != nil {
			return fmt.Errorf("broken: insert at commit: %w: %w", durable.ErrUnavailable, err)
		}
		return nil
	})
}

// releaseOnError releases the record when err says a write under tok
// could not be done (anything but fenced), and returns err.
func (s *Store) releaseOnError(ctx context.Context, ref durable.Ref, tok fence.Token, err error) error {
	if err != nil && !errors.Is(err, durable.ErrFenced) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.Store.Release(rctx, nil, ref, tok)
	}
	return err
}

// finishNoReread is a fenced Complete or Fail that takes a lost reply as
// "not applied" (fenced) instead of re-reading the record.
func (s *Store) finishNoReread(ctx context.Context, state durable.State, ref durable.Ref, tok fence.Token, res durable.Result) error {
	headers, body, err := encode(res)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET state = '`+string(state)+`', status_code = $6, response_headers = $7::jsonb,
		response_body = $8, response_version = $9, resource_id = $10, completed_at = clock_timestamp(), lease_expires_at = NULL,
		expires_at = GREATEST(expires_at, clock_timestamp() + COALESCE(retention_us * interval '1 microsecond', expires_at - created_at))
		WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3 AND generation = $4 AND owner_token = $5
			AND state IN ('processing', 'uncertain')`,
		ref.Tenant, ref.Operation, ref.KeyHash[:], int64(tok.Generation), tok.Owner, res.StatusCode, headers, body,
		res.Version, res.ResourceID)
	switch {
	case err != nil:
		// The bug: the write may have applied; taken as not applied.
		return fmt.Errorf("broken: %s: %w (its reply was lost; not re-read): %v", state, durable.ErrFenced, err)
	case tag.RowsAffected() == 0:
		return fmt.Errorf("broken: %s: %w", state, durable.ErrFenced)
	}
	return nil
}

// clockClaim runs claim (the real one, on q) as if the lease were measured
// by the worker's clock: first the record's lease is ended when the
// worker's clock says it ran out, then an acquisition gets a lease that
// ends at the worker's clock plus its length.
func (s *Store) clockClaim(ctx context.Context, q querier, p storeapi.ClaimParams, claim func() (storeapi.ClaimResult, error)) (storeapi.ClaimResult, error) {
	ref, err := s.Store.Ref(p.Scope)
	if err != nil {
		return storeapi.ClaimResult{}, err
	}
	// The bug: the worker's clock decides whether the lease ran out.
	if _, err := q.Exec(ctx, `UPDATE `+s.table+` SET lease_expires_at = clock_timestamp() - interval '1 millisecond'
		WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3 AND state = 'processing' AND owner_token IS NOT NULL
			AND lease_expires_at > clock_timestamp() AND lease_expires_at <= $4`,
		ref.Tenant, ref.Operation, ref.KeyHash[:], s.now()); err != nil {
		return storeapi.ClaimResult{}, fmt.Errorf("broken: claim: %w: %w", durable.ErrUnavailable, err)
	}
	res, err := claim()
	if err == nil && res.Acquired {
		err = s.setLease(ctx, q, ref, res.Token, p.Lease)
	}
	return res, err
}

// setLease sets the lease held by tok to end at the worker's clock plus
// lease.
func (s *Store) setLease(ctx context.Context, q querier, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	_, err := q.Exec(ctx, `UPDATE `+s.table+` SET lease_expires_at = $6
		WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3 AND generation = $4 AND owner_token = $5 AND state = 'processing'`,
		ref.Tenant, ref.Operation, ref.KeyHash[:], int64(tok.Generation), tok.Owner, s.now().Add(lease))
	if err != nil {
		return fmt.Errorf("broken: lease: %w: %w", durable.ErrUnavailable, err)
	}
	return nil
}

// encode returns the stored forms of res's headers (jsonb, nil without
// any) and body (never nil).
func encode(res durable.Result) (headers, body []byte, err error) {
	if len(res.Headers) > 0 {
		if headers, err = json.Marshal(res.Headers); err != nil {
			return nil, nil, err
		}
	}
	body = res.Body
	if body == nil {
		body = []byte{}
	}
	return headers, body, nil
}

func (s *Store) complete(ctx context.Context, q querier, ref durable.Ref, res durable.Result) error {
	headers, body, err := encode(res)
	if err != nil {
		return err
	}
	// The bug: no owner_token, generation or state in the WHERE clause.
	_, err = q.Exec(ctx, `UPDATE `+s.table+` SET state = 'completed', status_code = $4, response_headers = $5::jsonb,
		response_body = $6, response_version = $7, resource_id = $8, completed_at = clock_timestamp(), lease_expires_at = NULL
		WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3`,
		ref.Tenant, ref.Operation, ref.KeyHash[:], res.StatusCode, headers, body, res.Version, res.ResourceID)
	if err != nil {
		return fmt.Errorf("broken: complete: %w: %w", durable.ErrUnavailable, err)
	}
	return nil
}
