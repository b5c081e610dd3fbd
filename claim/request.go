package claim

import (
	"crypto/rand"
	"encoding/base64"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// Request is one request to claim: its scope and its canonical fingerprint
// (see package canon).
type Request struct {
	Scope       durable.Scope
	Fingerprint string
	// Lease overrides the Claimer's lease for this claim when not zero. It
	// follows the lease rule of [ErrInvalidLease] (negative is an error, at
	// least 100ms, longer than an explicit [WithStartMargin], not longer
	// than the operation's retention): a claim with a lease that breaks it
	// fails with ErrInvalidLease before anything is reserved.
	Lease time.Duration
}

// target is the record a request names, with what the steps of the request
// derive from it, computed once (the digest is hashed once): the store's
// reference, the operation identity and the Redis key names.
type target struct {
	ref    durable.Ref
	digest [32]byte // ref.Digest()
	opID   string
	keys   fastpath.Keys // zero without Redis
}

// targetOf returns the target of ref.
func (c *Claimer[TTx]) targetOf(ref durable.Ref) target {
	d := ref.Digest()
	t := target{ref: ref, digest: d, opID: operationID(d)}
	if c.scripts != nil {
		t.keys = c.scripts.KeysAt(d)
	}
	return t
}

// operationID is [durable.Ref.OperationID] of the Ref whose digest is d, in
// one allocation.
func operationID(d [32]byte) string {
	const prefix = "op_"
	var b [len(prefix) + 43]byte
	copy(b[:], prefix)
	base64.RawURLEncoding.Encode(b[len(prefix):], d[:])
	return string(b[:])
}

// newOwner returns a fresh random (version 4) owner identity, as uuid.New
// does, without its allocation.
func newOwner() uuid.UUID {
	var u uuid.UUID
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u
}

// prepare validates the request and returns its target. Every claim goes
// through it (Claim, Do, DoTx and the adapters' claims in a transaction),
// so it is also where the store's settings are first checked.
func (c *Claimer[TTx]) prepare(r Request) (target, storeapi.ClaimParams, error) {
	c.checkSettings()
	// The lease rule first: a configuration error of this claim's lease is
	// rejected before anything is reserved, rather than acquired and given
	// back every time.
	lease, err := c.requestLease(r)
	if err != nil {
		return target{}, storeapi.ClaimParams{}, err
	}
	p := storeapi.ClaimParams{
		Scope:       r.Scope,
		Fingerprint: r.Fingerprint,
		Owner:       newOwner(),
		Lease:       lease,
		Retention:   c.retentionFor(r.Scope.Operation),
	}
	if err := p.Validate(); err != nil {
		return target{}, p, wrap("claim", err)
	}
	ref, err := c.store.Ref(r.Scope)
	if err != nil {
		return target{}, p, wrap("claim", err)
	}
	return c.targetOf(ref), p, nil
}
