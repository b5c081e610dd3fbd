package claimgrpc

import (
	"github.com/oncekey/oncekey/claim/driver/settle"
)

// settlementFor decides what becomes of a handler's answer: a reply is
// stored as completed, an error status (whatever its code) as failed, since
// the handler may have acted before it failed; the engine applies the
// handler's MarkUncertain and ReleaseKey over it. A reply that cannot be
// stored (not a protobuf message) is recorded uncertain, and the error
// says why.
func settlementFor(resp any, herr error) (settle.Settlement, error) {
	res, failed, err := encodeReply(resp, herr)
	switch {
	case err != nil:
		return settle.Settlement{Kind: settle.Uncertain}, err
	case failed:
		return settle.Settlement{Kind: settle.Fail, Result: res}, nil
	}
	return settle.Settlement{Kind: settle.Complete, Result: res}, nil
}
