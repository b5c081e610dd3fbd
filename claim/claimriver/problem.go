package claimriver

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// problem writes an RFC 9457 problem: a fixed title per type, never the
// key, the tenant or the body.
func problem(w http.ResponseWriter, status int, typ, title string, retry time.Duration) {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}{typ, title, status})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retry > 0 {
		h.Set("Retry-After", strconv.FormatInt(seconds(retry), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// seconds rounds d up to whole seconds, at least 1.
func seconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}
