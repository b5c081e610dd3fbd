package claim

import (
	"strconv"
	"testing"

	"github.com/oncekey/oncekey/durable"
)

// operationID, from a digest, must spell every identity as
// durable.Ref.OperationID does: it is the identity callers store and poll.
func TestOperationID_IsRefOperationID(t *testing.T) {
	t.Parallel()
	for i := range 200 {
		ref := durable.Scope{Tenant: "t" + strconv.Itoa(i%7), Operation: "POST /o", Key: "k" + strconv.Itoa(i)}.Ref(nil)
		if got, want := operationID(ref.Digest()), ref.OperationID(); got != want {
			t.Fatalf("operationID = %q, want %q", got, want)
		}
	}
}

// newOwner returns distinct random version 4, RFC 4122 variant UUIDs, as
// uuid.New does.
func TestNewOwner_RandomV4(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		u := newOwner()
		if u.Version() != 4 || u.Variant().String() != "RFC4122" {
			t.Fatalf("%v: version %v, variant %v", u, u.Version(), u.Variant())
		}
		if seen[u.String()] {
			t.Fatalf("%v twice", u)
		}
		seen[u.String()] = true
	}
}
