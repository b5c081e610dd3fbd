package wire

// The representation versions (durable.Result.Version) of the results
// oncekey's adapters store and replay. Each adapter replays only its own
// format and refuses the others, so a result written for one transport can
// never be replayed as a success of another (a gRPC reply read as an HTTP
// 200, an HTTP 409 read as gRPC OK). docs/DESIGN.md section 14.
const (
	// ResultHTTP is claimhttp's format: the HTTP status, stored headers and
	// body. It is also the version hand-built HTTP results have always
	// used, so it stays 1.
	ResultHTTP = 1
	// ResultGRPC is claimgrpc's format: the gRPC code, and either the
	// reply's bytes with its full message name in a header, or the
	// marshalled google.rpc.Status. Far from the small numbers a service
	// may pick for formats of its own. claimgrpc wrote version 1 before
	// this one existed; it still replays those results (CHANGELOG).
	ResultGRPC = 1001
)

// HTTPReplayable reports whether res can be replayed as an HTTP response:
// not another adapter's format, and a final status (0, for a hand-built
// result, is sent as 200, as it always was). claimhttp and claimriver's
// Handler answer anything else with a 500 problem, never a success.
func HTTPReplayable(StatusCode, Version int) bool {
	if Version == ResultGRPC {
		return false
	}
	return StatusCode == 0 || StatusCode >= 200 && StatusCode <= 999
}
