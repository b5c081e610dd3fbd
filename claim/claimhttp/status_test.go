package claimhttp

import "testing"

// The status policies of the two modes (package documentation, step 5).
func TestStatusPolicies(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]disposition{
		200: storeCompleted, 201: storeCompleted, 204: storeCompleted, 303: storeCompleted,
		400: storeFailed, 402: storeFailed, 404: storeFailed, 422: storeFailed,
		408: release, 409: release, 425: release, 429: release,
		500: release, 502: release, 503: release, 504: release,
	} {
		if got := txStatus(status); got != want {
			t.Errorf("txStatus(%d) = %v, want %v", status, got, want)
		}
		// Workflow mode never releases on its own: the handler may have acted.
		wantWorkflow := storeCompleted
		if status >= 400 {
			wantWorkflow = storeFailed
		}
		if got := workflowStatus(status); got != wantWorkflow {
			t.Errorf("workflowStatus(%d) = %v, want %v", status, got, wantWorkflow)
		}
	}
}
