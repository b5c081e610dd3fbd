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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
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
)

// Modes lists every mode.
func Modes() []Mode { return []Mode{CompleteWithoutFence, ClaimTrustsRedis} }

// ErrUnknownMode is returned by [Wrap] for an unknown mode.
var ErrUnknownMode = errors.New("broken: unknown mode")

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Store is a PostgreSQL store with one deliberate bug; every method the bug
// does not touch is the real store's.
type Store struct {
	*postgres.Store
	pool *pgxpool.Pool
	mode Mode
}

var _ durable.Store[pgx.Tx] = (*Store)(nil)

// Wrap returns s, which runs on pool, with the bug of mode.
func Wrap(s *postgres.Store, pool *pgxpool.Pool, mode Mode) (*Store, error) {
	switch mode {
	case CompleteWithoutFence, ClaimTrustsRedis:
		return &Store{Store: s, pool: pool, mode: mode}, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownMode, mode)
}

// Claim is the real claim, or with ClaimTrustsRedis an unconditional
// overwrite.
func (s *Store) Claim(ctx context.Context, p durable.ClaimParams) (durable.ClaimResult, error) {
	if s.mode != ClaimTrustsRedis {
		return s.Store.Claim(ctx, p)
	}
	return s.claim(ctx, s.pool, p)
}

// ClaimTx is Claim inside tx.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, p durable.ClaimParams) (durable.ClaimResult, error) {
	if s.mode != ClaimTrustsRedis {
		return s.Store.ClaimTx(ctx, tx, p)
	}
	return s.claim(ctx, tx, p)
}

func (s *Store) claim(ctx context.Context, q querier, p durable.ClaimParams) (durable.ClaimResult, error) {
	if err := p.Validate(); err != nil {
		return durable.ClaimResult{}, err
	}
	ref, err := s.Ref(p.Scope)
	if err != nil {
		return durable.ClaimResult{}, err
	}
	var gen int64
	err = q.QueryRow(ctx, `INSERT INTO `+s.Table()+` (tenant_id, operation, key_hash, request_hash, state, generation,
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
		return durable.ClaimResult{}, fmt.Errorf("broken: claim: %w: %w", durable.ErrUnavailable, err)
	}
	return durable.ClaimResult{Acquired: true, Ref: ref, Token: fence.Token{Generation: uint64(gen), Owner: p.Owner}}, nil
}

// Complete is the real completion, or with CompleteWithoutFence one that
// writes whatever token asks.
func (s *Store) Complete(ctx context.Context, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if s.mode != CompleteWithoutFence {
		return s.Store.Complete(ctx, ref, tok, res)
	}
	return s.complete(ctx, s.pool, ref, res)
}

// CompleteTx is Complete inside tx.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if s.mode != CompleteWithoutFence {
		return s.Store.CompleteTx(ctx, tx, ref, tok, res)
	}
	return s.complete(ctx, tx, ref, res)
}

func (s *Store) complete(ctx context.Context, q querier, ref durable.Ref, res durable.Result) error {
	var headers []byte
	if len(res.Headers) > 0 {
		var err error
		if headers, err = json.Marshal(res.Headers); err != nil {
			return err
		}
	}
	body := res.Body
	if body == nil {
		body = []byte{}
	}
	// The bug: no owner_token, generation or state in the WHERE clause.
	_, err := q.Exec(ctx, `UPDATE `+s.Table()+` SET state = 'completed', status_code = $4, response_headers = $5::jsonb,
		response_body = $6, response_version = $7, resource_id = $8, completed_at = clock_timestamp(), lease_expires_at = NULL
		WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3`,
		ref.Tenant, ref.Operation, ref.KeyHash[:], res.StatusCode, headers, body, res.Version, res.ResourceID)
	if err != nil {
		return fmt.Errorf("broken: complete: %w: %w", durable.ErrUnavailable, err)
	}
	return nil
}
