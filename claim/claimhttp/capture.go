package claimhttp

import (
	"bytes"
	"fmt"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/durable"
)

// resultVersion is the version of the stored representation written by this
// package (durable.Result.Version): status, stored headers, body, with
// claimclient.HeaderBodyOmitted marking an omitted body.
const resultVersion = 1

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

// replay sends a stored result, byte for byte, marked as replayed.
func replay(w http.ResponseWriter, res *durable.Result) { writeStored(w, res, true) }

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
