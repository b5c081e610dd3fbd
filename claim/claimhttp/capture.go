package claimhttp

import (
	"bytes"
	"fmt"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/wire"
)

// resultVersion is the version of the stored representation written by this
// package (durable.Result.Version): status, stored headers, body, with
// claimclient.HeaderBodyOmitted marking an omitted body.
const resultVersion = wire.ResultHTTP

// capture is the ResponseWriter a guarded handler writes to. It buffers the
// whole response, because the response may be published only after its
// result is durable.
//
// It deliberately implements neither http.Flusher nor http.Hijacker, nor
// Unwrap: a streaming handler finds out at once (http.ResponseController
// returns http.ErrNotSupported) instead of streaming bytes that a retry
// could never replay. Read and write deadlines pass through.
type capture struct {
	real   http.ResponseWriter
	header http.Header
	status int
	body   bytes.Buffer
	limit  int64
	err    error // ErrResponseTooLarge once the limit was passed
}

func newCapture(real http.ResponseWriter, limit int64) *capture {
	return &capture{real: real, header: http.Header{}, limit: limit}
}

// Header returns the response headers being built.
func (c *capture) Header() http.Header { return c.header }

// WriteHeader records the status. Informational (1xx) statuses are dropped:
// nothing can reach the client before the result is durable.
func (c *capture) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if c.status != 0 || code < 200 {
		return
	}
	c.status = code
}

// Write buffers p, up to the limit.
func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if c.err != nil {
		return 0, c.err
	}
	if int64(c.body.Len())+int64(len(p)) > c.limit {
		c.err = ErrResponseTooLarge
		return 0, c.err
	}
	return c.body.Write(p)
}

// SetReadDeadline passes through to the real connection.
func (c *capture) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(c.real).SetReadDeadline(t)
}

// SetWriteDeadline passes through to the real connection.
func (c *capture) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(c.real).SetWriteDeadline(t)
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// finish settles the response as net/http would send it: status 200 when
// none was written, and the sniffed Content-Type when the handler set none
// and wrote a body without a Content-Encoding (so the stored header equals
// what the first client got).
func (c *capture) finish() {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	_, typed := c.header["Content-Type"]
	if !typed && c.header.Get("Content-Encoding") == "" && c.body.Len() > 0 {
		c.header.Set("Content-Type", http.DetectContentType(c.body.Bytes()))
	}
}

// result is the stored representation of the response.
func (c *capture) result(stored []string, maxBody int64) durable.Result {
	h := make(map[string][]string, len(stored)+1)
	for _, name := range stored {
		if v := c.header.Values(name); len(v) > 0 {
			h[name] = append([]string(nil), v...)
		}
	}
	res := durable.Result{
		StatusCode: c.status,
		Headers:    h,
		Body:       bytes.Clone(c.body.Bytes()),
		Version:    resultVersion,
		ResourceID: c.header.Get("Location"),
	}
	if res.Body == nil {
		res.Body = []byte{}
	}
	if int64(len(res.Body)) > maxBody {
		res.Body = []byte{}
		delete(h, "Content-Type")
		h[claimclient.HeaderBodyOmitted] = []string{"true"}
	}
	return res
}

// publish sends the captured response to the client. Headers the handler
// set win over those already on w (the retention header, an outer
// middleware's).
func (c *capture) publish(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range c.header {
		h[k] = v
	}
	w.WriteHeader(c.status)
	if c.body.Len() > 0 {
		_, _ = w.Write(c.body.Bytes())
	}
}

// replay sends a stored result, byte for byte, marked as replayed. A
// result in another adapter's format (claimgrpc's: a gRPC code is no HTTP
// status, a reply's bytes no body), or with a status no final HTTP
// response has, is not replayed: a 500 problem, never a success it does
// not hold.
func replay(w http.ResponseWriter, res *durable.Result) {
	if !replayable(res) {
		writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The stored result of this key cannot be replayed.", "", 0)
		return
	}
	writeStored(w, res, true)
}

// replayable reports whether res is in this package's format
// (wire.HTTPReplayable).
func replayable(res *durable.Result) bool { return wire.HTTPReplayable(res.StatusCode, res.Version) }

// ResponseResult returns the result the middleware stores for a handler
// that answered status, header and body: store it as completed or failed
// (claim.Resolved in a [claim.Reconciler]'s resolve function, or oncekey
// resolve -format http) and every retry gets exactly that response, marked
// replayed. header holds the fields to replay (the names are
// canonicalized; Location also names the created resource). status must
// be a final status, 200 to 599; 204 and 304 take no body.
func ResponseResult(status int, header http.Header, body []byte) (durable.Result, error) {
	switch {
	case status < 200 || status > 599:
		return durable.Result{}, fmt.Errorf("claimhttp: ResponseResult: status %d is not a final HTTP status (200 to 599)", status)
	case len(body) > 0 && !bodyAllowed(status):
		return durable.Result{}, fmt.Errorf("claimhttp: ResponseResult: a %d response has no body", status)
	}
	h := make(map[string][]string, len(header))
	for k, v := range header {
		h[http.CanonicalHeaderKey(k)] = append(h[http.CanonicalHeaderKey(k)], v...)
	}
	return durable.Result{
		StatusCode: status,
		Headers:    h,
		Body:       append([]byte{}, body...),
		Version:    resultVersion,
		ResourceID: http.Header(h).Get("Location"),
	}, nil
}

// writeStored sends a stored result, byte for byte.
func writeStored(w http.ResponseWriter, res *durable.Result, replayed bool) {
	h := w.Header()
	for k, v := range res.Headers {
		h[k] = append([]string(nil), v...)
	}
	if replayed {
		h.Set(claimclient.HeaderReplayed, "true")
	}
	status := res.StatusCode
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if len(res.Body) > 0 {
		_, _ = w.Write(res.Body)
	}
}
