package claim_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// TestSentinels_AreDurables: claim's ErrMismatch, ErrInvalidScope,
// ErrUnavailable and ErrFenced are durable's sentinels under a second name,
// so errors.Is matches either name against an error wrapping the other.
func TestSentinels_AreDurables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		claim, store error
	}{
		{"ErrMismatch", claim.ErrMismatch, durable.ErrMismatch},
		{"ErrInvalidScope", claim.ErrInvalidScope, durable.ErrInvalidScope},
		{"ErrUnavailable", claim.ErrUnavailable, durable.ErrUnavailable},
		{"ErrFenced", claim.ErrFenced, durable.ErrFenced},
	} {
		if tc.claim != tc.store {
			t.Errorf("claim.%s = %v, want durable.%s", tc.name, tc.claim, tc.name)
		}
		if err := fmt.Errorf("wrapped: %w", tc.store); !errors.Is(err, tc.claim) {
			t.Errorf("an error wrapping durable.%s does not match claim.%s", tc.name, tc.name)
		}
		if err := fmt.Errorf("wrapped: %w", tc.claim); !errors.Is(err, tc.store) {
			t.Errorf("an error wrapping claim.%s does not match durable.%s", tc.name, tc.name)
		}
	}
}
