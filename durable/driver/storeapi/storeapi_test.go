package storeapi_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

func TestClaimParams_Validate(t *testing.T) {
	base := storeapi.ClaimParams{
		Scope:       durable.Scope{Tenant: "t", Operation: "o", Key: "k"},
		Fingerprint: "v1:x", Owner: uuid.New(), Lease: time.Millisecond, Retention: time.Millisecond, Proposed: 1 << 62,
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("valid params: %v", err)
	}
	for field, mutate := range map[string]func(*storeapi.ClaimParams){
		"key":         func(p *storeapi.ClaimParams) { p.Scope.Key = "" },
		"fingerprint": func(p *storeapi.ClaimParams) { p.Fingerprint = strings.Repeat("f", 257) },
		"owner":       func(p *storeapi.ClaimParams) { p.Owner = uuid.Nil },
		"lease":       func(p *storeapi.ClaimParams) { p.Lease = time.Millisecond - 1 },
		"retention":   func(p *storeapi.ClaimParams) { p.Retention = 0 },
		"proposed":    func(p *storeapi.ClaimParams) { p.Proposed = 1<<62 + 1 },
	} {
		p := base
		mutate(&p)
		err := p.Validate()
		if !errors.Is(err, durable.ErrInvalidScope) || !strings.HasPrefix(err.Error(), "durable: invalid "+field+": ") {
			t.Errorf("invalid %s: Validate = %v", field, err)
		}
	}
}

func TestInvalid(t *testing.T) {
	err := storeapi.Invalid("batch", "less than 1")
	if !errors.Is(err, durable.ErrInvalidScope) || err.Error() != "durable: invalid batch: less than 1" {
		t.Fatalf("Invalid = %v", err)
	}
}

func TestValidState(t *testing.T) {
	for _, s := range []durable.State{durable.Processing, durable.Completed, durable.Failed, durable.Uncertain} {
		if !storeapi.ValidState(s) {
			t.Errorf("%s not valid", s)
		}
	}
	for _, s := range []durable.State{"released", "", "Completed"} {
		if storeapi.ValidState(s) {
			t.Errorf("%q reported valid", s)
		}
	}
}
