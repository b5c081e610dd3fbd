package claim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// Operation reads an operation by the identity the Claimer handed out,
// through processing and completed, within the caller's tenant only; a
// malformed, unknown or other tenant's id is ErrNotFound alike.
func TestClaimer_Operation(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode)
			ctx := t.Context()
			r := req("op-lookup", "v1:a")
			out := mustClaim(t, e.c, r, claim.Acquired)
			id := out.OperationID
			if id != out.Lease.OperationID() {
				t.Fatalf("Outcome.OperationID %q != Lease.OperationID %q", id, out.Lease.OperationID())
			}
			rec, err := e.c.Operation(ctx, "acme", id)
			if err != nil || rec.State != durable.Processing || rec.Ref != e.ref(r) {
				t.Fatalf("Operation while processing = %v %v, %v", rec.Ref, rec.State, err)
			}
			if err := out.Lease.Complete(ctx, result(`{"ok":1}`)); err != nil {
				t.Fatal(err)
			}
			rec, err = e.c.Operation(ctx, "acme", id)
			if err != nil || rec.State != durable.Completed || string(rec.Result.Body) != `{"ok":1}` {
				t.Fatalf("Operation once completed = %v %+v, %v", rec.State, rec.Result, err)
			}

			// The same key in another tenant is another operation.
			other := r
			other.Scope.Tenant = "globex"
			oout := mustClaim(t, e.c, other, claim.Acquired)
			defer oout.Lease.Release(ctx)
			if oout.OperationID == id {
				t.Fatal("two tenants share an operation id")
			}
			bad := []struct{ what, tenant, id string }{
				{"another tenant", "globex", id},
				{"the other way round", "acme", oout.OperationID},
				{"an empty tenant", "", id},
				// Not valid UTF-8, a control character, too long: no
				// record can have them, answered like an unknown id
				// (PostgreSQL refused the first as text, issue 27 #8).
				{"a tenant not valid UTF-8", "acme\xff", id},
				{"a tenant with a NUL", "ac\x00me", id},
				{"a tenant over 512 bytes", strings.Repeat("a", 513), id},
				{"no prefix", "acme", id[3:]},
				{"truncated", "acme", id[:len(id)-1]},
				{"non-canonical spelling", "acme", id[:len(id)-1] + nonCanonical(id[len(id)-1])},
				{"unknown", "acme", "op_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
				{"garbage", "acme", "op_" + string(make([]byte, 43))},
			}
			for _, b := range bad {
				if rec, err := e.c.Operation(ctx, b.tenant, b.id); !errors.Is(err, durable.ErrNotFound) {
					t.Errorf("%s: Operation = %v, %v; want ErrNotFound", b.what, rec.Ref, err)
				}
			}
		})
	}
}

// nonCanonical returns another base64url character that decodes the same
// 32 bytes as c in the last position (its two low bits are padding).
func nonCanonical(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range alphabet {
		if alphabet[i] == c {
			return string(alphabet[i^1])
		}
	}
	return "?"
}
