// Package history records what a chaos scenario did, for package check:
// every attempt a client made (start, end, outcome, token, result hash),
// every run of Do's business function (its start and end in process, and
// the effect it wrote), every business effect (in a table that
// deliberately has no unique constraint, so a duplicate is visible),
// samples of the durable generations, and the final durable records read
// with plain SQL.
//
// Times are offsets on the monotonic clock from the recorder's start.
// Results are named by the hex SHA-256 of their body, never by their
// content, and operations by the suite's own names, never by a raw
// idempotency key of a user.
package history

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/fence"
)

// Kind is what a recorded call came to, as far as its caller knows.
type Kind string

// The kinds of call.
const (
	// Acquire: Claim returned a lease with Token (workflow mode).
	Acquire Kind = "acquire"
	// Execute: Do ran the business function and committed its result
	// (Body) under Token.
	Execute Kind = "execute"
	// Complete: a fenced Complete or Fail under Token stored Body.
	Complete Kind = "complete"
	// Adopt: the reconciler took the record over under Token.
	Adopt Kind = "adopt"
	// Replay: a stored result (Body) came back; nothing ran.
	Replay Kind = "replay"
	// Mismatch: the key was refused because it holds another fingerprint.
	Mismatch Kind = "mismatch"
	// Fenced: a fenced write under Token was rejected; nothing was written.
	Fenced Kind = "fenced"
	// NoEffect: the call ended without result and, as its caller knows,
	// without writing anything (in progress, uncertain, unavailable before
	// any write, a rolled-back transaction).
	NoEffect Kind = "none"
)

// Answer is what a call that got no result (NoEffect) was told about its
// operation, when it was told anything: that it is still in progress, or
// that its outcome is uncertain. Calls told nothing (an error, a timeout)
// and every other kind of call have none.
type Answer string

// The answers.
const (
	// InProgress: claim.InProgress, retry later.
	InProgress Answer = "in_progress"
	// Uncertain: claim.Uncertain, its outcome unknown until resolved.
	Uncertain Answer = "uncertain"
)

// Call is one recorded call.
type Call struct {
	ID     int
	Key    string // the logical key: "<scenario>/<n>"
	Epoch  int    // 1, then 2 for a retry after the retention window
	Client int
	Kind   Kind
	// Ambiguous: the call may or may not have applied (a timeout, a lost
	// connection after sending). The checker gives it an open end: it may
	// take effect at any time after it started.
	Ambiguous   bool
	Token       fence.Token
	Fingerprint string
	// Body is the hex SHA-256 of the result body: the stored one for
	// Execute, Complete and Replay, the one it tried to store for an
	// ambiguous Execute or Complete.
	Body   string
	Status int
	// Answer, for a NoEffect call, is what it was told about the
	// operation (in progress, uncertain), when it was told that.
	Answer Answer
	// Start is when the call was sent (invoked), End when its answer
	// came back: a call whose End is before another's Start finished
	// before that one began, in real time.
	Start time.Duration
	End   time.Duration
	Note  string
}

// Op names the logical operation of the call: its key and epoch.
func (c Call) Op() string { return OpName(c.Key, c.Epoch) }

// OpName names a logical operation: one key within one retention epoch.
func OpName(key string, epoch int) string { return fmt.Sprintf("%s#%d", key, epoch) }

// Effect is one row of the effects table: one business effect as it was
// written, by a business function in Do or by the downstream.
type Effect struct {
	ID         int64
	Key        string
	Epoch      int
	Owner      uuid.UUID
	Generation uint64
	// Body is the hex SHA-256 of the result body that the operation must
	// replay if this effect is the one that counted.
	Body string
	Via  string // "do" or "downstream"
}

// Run is one run of Do's business function (fn) as its process saw it:
// from fn's entry to its return, both inside fn's transaction (the lock or
// claim before it, the COMMIT after it), on the recorder's clock. A call
// may run fn more than once (a first run rolled back, then the claim's).
type Run struct {
	Key    string
	Epoch  int
	Client int
	// Call is the ID of the call whose Do ran it (0: not known).
	Call int
	// Locked: the Claimer runs Do without claim.WithWriteAtCommit, so fn
	// runs in a transaction that took the key's lock before it (Do's lock
	// first, or the claim's statement) and holds it until it ends. Runs of
	// the opt-in (fn first, the record at COMMIT) hold no lock.
	Locked bool
	Start  time.Duration
	End    time.Duration
	// Returned: the function returned a result (a success, or a business
	// rejection), not an error or a panic: its transaction went on to
	// the record's write.
	Returned bool
	// Effect is the row id of the effect fn inserted in its transaction (0
	// when it inserted none): the run committed exactly when that row is
	// in the effects table at the end.
	Effect int64
}

// Op names the logical operation of the run: its key and epoch.
func (r Run) Op() string { return OpName(r.Key, r.Epoch) }

// Sample is one reading of a record's generation.
type Sample struct {
	Key        string
	At         time.Duration
	Generation uint64
}

// Record is a durable record as the checker reads it, with plain SQL.
type Record struct {
	Key        string
	State      string // processing, completed, failed, uncertain
	Generation uint64
	Owner      uuid.UUID // uuid.Nil when released
	Body       string    // hex SHA-256 of the stored body, "" without a result
	Status     int
	Expired    bool // past its retention by the database clock
	// Sweepable: past its retention and with a generation more than the
	// documented two minutes behind the database clock in milliseconds, so
	// that Sweep must delete it if it is finished (generations stay
	// monotonic across deletion: durable's package documentation).
	Sweepable bool
}

// Hash returns the hex SHA-256 of b.
func Hash(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Recorder collects calls. It is safe for concurrent use.
type Recorder struct {
	start time.Time

	mu    sync.Mutex
	calls []Call
	runs  []Run
}

// NewRecorder returns a recorder whose clock starts now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now returns the recorder's clock: the monotonic time since it started.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// Add records c and returns its ID.
func (r *Recorder) Add(c Call) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.ID = len(r.calls) + 1
	r.calls = append(r.calls, c)
	return c.ID
}

// AddRun records a run of Do's function.
func (r *Recorder) AddRun(x Run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, x)
}

// Runs returns the runs of Do's function recorded so far, in the order
// they ended.
func (r *Recorder) Runs() []Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Run(nil), r.runs...)
}

// Calls returns the calls recorded so far, in the order they ended.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Call(nil), r.calls...)
}

// Counts returns how many calls of each kind were recorded.
func (r *Recorder) Counts() map[Kind]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[Kind]int{}
	for _, c := range r.calls {
		m[c.Kind]++
	}
	return m
}

// SortSamples orders samples by key, then time.
func SortSamples(s []Sample) {
	sort.SliceStable(s, func(i, j int) bool {
		if s[i].Key != s[j].Key {
			return s[i].Key < s[j].Key
		}
		return s[i].At < s[j].At
	})
}
