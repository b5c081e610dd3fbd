package claimhttp

import (
	"github.com/oncekey/oncekey/claim/driver/settle"
)

// settlementFor decides what becomes of a workflow handler's response: every
// response is stored (workflowStatus decides completed or failed); the
// engine applies the handler's MarkUncertain and ReleaseKey over it. A
// response over MaxResponseBody is stored by its status without its body,
// as one over MaxStoredBody is.
func (m *middleware[TTx]) settlementFor(cw *capture) settle.Settlement {
	maxStored := m.o.maxStoredBody
	if cw.err != nil {
		maxStored = -1 // omit the body: it was never whole
	}
	res := cw.result(m.o.stored, maxStored)
	if workflowStatus(cw.status) == storeCompleted {
		return settle.Settlement{Kind: settle.Complete, Result: res}
	}
	return settle.Settlement{Kind: settle.Fail, Result: res}
}
