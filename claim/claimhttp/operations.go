package claimhttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/driver/problem"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// Operations returns a handler serving the operation resource that the
// Location of the middleware's 202 answers names: GET (and HEAD) of
// {WithOperationPath}{id}, "/operations/op_..." by default. Mount it on
// any router under that prefix (mux.Handle("GET /operations/", h),
// chi's r.Get("/operations/{id}", h.ServeHTTP)); it reads the id from the
// request path after the prefix's path.
//
// tenant is the same authentication function as the middleware's: an
// operation is read only within its tenant ([claim.Claimer.Operation]).
// Of the options only [WithOperationPath], [WithRetryAfter] and
// [WithLogger] apply; [ErrConfig] for a bad one.
//
// A known operation answers 200 application/json:
//
//	{"id": "op_...", "state": "processing", "accepted_at": "2026-12-03T10:00:00.123Z"}
//	{"id": "op_...", "state": "completed", "accepted_at": "...", "finished_at": "...",
//	 "result": {"status": 201, "location": "/orders/ord_1"}}
//
// state is processing, completed, failed or uncertain; accepted_at is when
// the operation's first request was claimed. While it is processing or
// uncertain the answer carries Retry-After ([WithRetryAfter]), and a
// workflow with steps (claim.Lease.Step) names the step it runs or stopped
// at: "step": {"name": "charge", "state": "started"} (or "uncertain"). Once it is
// completed or failed, finished_at is set and result gives the way to the
// result: the stored status code and, when the handler set one, the stored
// Location header. The stored body is not served here: it may be large and
// belongs to the response of the request itself; re-sending the original
// request with the same key replays it in full, and the location is read
// with the resource's own authorization. Every answer carries
// "Cache-Control: no-store". None carries the key, the tenant, the
// request's body or the stored body.
//
// An id that is malformed, unknown, swept, released (nothing happened; the
// key is free and re-sending the request runs it) or another tenant's
// answers 404 application/problem+json alike. No tenant answers 401, an
// unreachable store 503 with Retry-After, other methods 405.
func Operations[TTx any](c *claim.Claimer[TTx], tenant func(r *http.Request) (string, error), opts ...Option) (http.Handler, error) {
	if c == nil {
		return nil, configErr("nil Claimer")
	}
	o, err := newConfig(tenant, opts)
	if err != nil {
		return nil, err
	}
	prefix := o.operationPath
	if u, err := url.Parse(prefix); err == nil && u.Path != "" {
		prefix = u.Path // an absolute prefix ("https://api.example/operations/")
	}
	return &operations[TTx]{c: c, o: o, prefix: prefix}, nil
}

type operations[TTx any] struct {
	c      *claim.Claimer[TTx]
	o      config
	prefix string
}

// operationView is the JSON of an operation.
type operationView struct {
	ID         string           `json:"id"`
	State      durable.State    `json:"state"`
	AcceptedAt time.Time        `json:"accepted_at"`
	FinishedAt *time.Time       `json:"finished_at,omitempty"`
	Result     *operationResult `json:"result,omitempty"`
	Step       *operationStep   `json:"step,omitempty"`
}

// operationStep is the step of a workflow (claim.Lease.Step) that a
// processing operation runs, or an uncertain one stopped at.
type operationStep struct {
	Name  string            `json:"name"`
	State durable.StepState `json:"state"`
}

type operationResult struct {
	Status   int    `json:"status"`
	Location string `json:"location,omitempty"`
}

func (h *operations[TTx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	tenant, err := h.o.tenant(r)
	if err != nil || tenant == "" {
		writeProblem(w, http.StatusUnauthorized, claimclient.ProblemUnidentified, problem.DetailUnidentified, "", 0)
		return
	}
	id, ok := strings.CutPrefix(r.URL.Path, h.prefix)
	if !ok || strings.Contains(id, "/") {
		h.notFound(w)
		return
	}
	rec, err := h.c.Operation(r.Context(), tenant, id)
	switch {
	case errors.Is(err, durable.ErrNotFound):
		h.notFound(w)
		return
	case errors.Is(err, claim.ErrUnavailable):
		writeProblem(w, http.StatusServiceUnavailable, claimclient.ProblemUnavailable, "The operation could not be read; retry after the Retry-After delay.", "", h.o.RetryAfter)
		return
	case err != nil:
		h.o.Logger.Error("claimhttp: reading an operation failed", logkeys.Op, id, logkeys.Err, err)
		writeProblem(w, http.StatusInternalServerError, claimclient.ProblemInternal, "The operation could not be read.", "", 0)
		return
	case rec.Released:
		// The application released it: nothing happened, the key is free.
		h.notFound(w)
		return
	}
	v := operationView{ID: id, State: rec.State, AcceptedAt: rec.CreatedAt.UTC()}
	hdr := w.Header()
	if rec.State.Finished() && rec.Result != nil {
		at := rec.CompletedAt.UTC()
		v.FinishedAt = &at
		v.Result = &operationResult{Status: rec.Result.StatusCode}
		if loc := http.Header(rec.Result.Headers).Get("Location"); loc != "" {
			v.Result.Location = loc
		}
	} else {
		hdr.Set("Retry-After", strconv.FormatInt(seconds(h.o.RetryAfter), 10))
		if rec.Step != nil {
			v.Step = &operationStep{Name: rec.Step.Name, State: rec.Step.State}
		}
	}
	body, _ := json.Marshal(v) // strings, times and ints
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
}

func (h *operations[TTx]) notFound(w http.ResponseWriter) {
	writeProblem(w, http.StatusNotFound, problemNotFound, "There is no such operation.", "", 0)
}
