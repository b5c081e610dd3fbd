package chaos

import (
	"testing"

	"github.com/oncekey/oncekey/durable"
)

// TestRecStore_OpOfIsTheRecordNotTheKey: the scenarios of a run share its
// table and tenant, each under its own operation, so the same key names a
// record of each. A write to another scenario's record (a River job a
// scenario left behind, worked by the next one's workers) must not be
// recorded in this scenario's history, where it would read as a second
// grant of this scenario's operation (river-windows in the 2026-12-05
// soak: "no sequential execution of the record explains its calls").
func TestRecStore_OpOfIsTheRecordNotTheKey(t *testing.T) {
	// The key of operation i is "k-<run>-<i>" in every scenario of a run.
	scope := durable.Scope{Tenant: "chaos-x", Operation: "river-windows", Key: "k-x-2"}
	o := &op{key: "river-windows/2", scope: scope, ref: scope.Ref(nil)}
	e := &env{keyspace: map[[32]byte]string{o.ref.KeyHash: o.key}, ops: map[string]*op{"op_1": o}}
	s := &recStore{e: e}

	if got, _ := s.opOf(o.ref); got != o {
		t.Fatalf("opOf(the scenario's own record) = %v, want its op", got)
	}
	other := scope
	other.Operation = "async-river"
	if got, _ := s.opOf(other.Ref(nil)); got != nil {
		t.Fatal("opOf(another scenario's record with the same key) found this scenario's op")
	}
	tenant := scope
	tenant.Tenant = "chaos-y"
	if got, _ := s.opOf(tenant.Ref(nil)); got != nil {
		t.Fatal("opOf(another tenant's record with the same key) found this scenario's op")
	}
}
