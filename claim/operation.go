package claim

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// Operation reads, for tenant, the operation whose identity is id (the
// "op_..." of [Outcome.OperationID] and [Lease.OperationID]) from the
// durable store, the source of truth (Redis is not asked): one indexed
// read. The record's State says where it is (processing, completed, failed,
// uncertain); a finished record holds its stored Result, and a processing or
// uncertain one of a workflow with steps ([Lease.Step]) names the step it
// runs or stopped at in Step (a second read).
//
// It returns an error matching [durable.ErrNotFound] for an id that is
// malformed or unknown, that the sweeper deleted, or that belongs to
// another tenant, and for a tenant no record can have (one that
// [durable.Scope.Validate] refuses: empty, not valid UTF-8, a control
// character, over 512 bytes), which is not sent to the store: the answer
// never tells whether another tenant has that operation, and bad input is
// answered like an unknown operation. [ErrUnavailable] when the store
// cannot be reached.
//
// The record carries the stored identity of the scope (tenant, operation,
// key hash) and the fingerprint: show a caller only what it may see (the
// Operations handler of package claimhttp shows neither).
func (c *Claimer[TTx]) Operation(ctx context.Context, tenant, id string) (durable.Record, error) {
	c.checkSettings()
	digest, ok := parseOperationID(id)
	if !ok || !validTenant(tenant) {
		return durable.Record{}, fmt.Errorf("claim: operation: %w", durable.ErrNotFound)
	}
	rec, err := c.store.Operation(ctx, tenant, digest)
	if err != nil {
		return durable.Record{}, wrap("operation", err)
	}
	if rec.Ref.Tenant != tenant || rec.Ref.OperationID() != id {
		// Never: the store matched both. Fail closed.
		return durable.Record{}, fmt.Errorf("claim: operation: %w", durable.ErrNotFound)
	}
	if !rec.State.Finished() && !rec.Released {
		steps, err := c.listSteps(ctx, rec.Ref)
		if err != nil {
			return durable.Record{}, wrap("operation", err)
		}
		rec.Step = storeapi.CurrentStep(steps)
	}
	return rec, nil
}

// validTenant reports whether tenant passes the tenant rules of
// [durable.Scope.Validate], the only tenants a record can be claimed for.
func validTenant(tenant string) bool {
	return durable.Scope{Tenant: tenant, Operation: "o", Key: "k"}.Validate() == nil
}

// parseOperationID returns the digest of an operation identity, "op_"
// followed by the 43 base64url characters (no padding) of 32 bytes, in its
// one canonical spelling.
func parseOperationID(id string) ([32]byte, bool) {
	var d [32]byte
	s, ok := strings.CutPrefix(id, "op_")
	if !ok || len(s) != 43 {
		return d, false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != len(d) {
		return d, false
	}
	copy(d[:], b)
	return d, true
}
