package claimtest

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// finalWithin bounds how long a request is retried while it is answered
// "in progress": well past the Env's lease, which is the longest a Redis
// lease left behind can hold a key.
const finalWithin = 30 * time.Second

// retryEvery is the pause between retries of an in-progress answer (the
// server's Retry-After is whole seconds; a test need not wait that long).
const retryEvery = 20 * time.Millisecond

// logSkipped logs on tb (when not nil) each window of skipped, asked for
// but not applying where.
func logSkipped(tb testing.TB, skipped []Window, where string) {
	if tb == nil {
		return
	}
	tb.Helper()
	for _, w := range skipped {
		tb.Logf("claimtest: window %s does not apply %s: skipped", w, where)
	}
}

// runWindows runs each window of run, with a fresh key, through window and
// returns their accounts, headed head; runs counts the runs of the code
// under test.
func runWindows(run []Window, head string, runs *atomic.Int64, effects func() int, window func(a *account, effects func() int, before int)) []*account {
	var accounts []*account
	for _, w := range run {
		a := &account{window: w, key: newKey(), head: head}
		before, n := effects(), runs.Load()
		window(a, effects, before)
		a.runs = runs.Load() - n
		accounts = append(accounts, a)
	}
	return accounts
}

// untilFinal calls send until its answer is not in progress (for at most
// finalWithin) and returns the last answer with how many calls it took.
func untilFinal[A interface{ inProgress() bool }](send func() A) (A, int) {
	deadline := time.Now().Add(finalWithin)
	for tries := 1; ; tries++ {
		a := send()
		if !a.inProgress() || time.Now().After(deadline) {
			return a, tries
		}
		time.Sleep(retryEvery)
	}
}

// numbered lists the answers pick picks by their numbers, counted from 1:
// "#2, #5"; "" when it picks none.
func numbered[A any](answers []A, pick func(A) bool) string {
	var ns []string
	for i, x := range answers {
		if pick(x) {
			ns = append(ns, fmt.Sprintf("#%d", i+1))
		}
	}
	return strings.Join(ns, ", ")
}

// atOnce makes n calls of call at once and returns their answers.
func atOnce[A any](n int, call func() A) []A {
	answers := make([]A, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			answers[i] = call()
		})
	}
	close(start)
	wg.Wait()
	return answers
}

// maxShown is the most bytes of a body an account shows.
const maxShown = 200

// newKey returns a fresh idempotency key for one window.
func newKey() string {
	return "claimtest-" + rand.Text()
}

// keyName names a key in an account without showing it: a short hash.
func keyName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:4])
}

// account is what one window sent and got back, and what was wrong.
type account struct {
	window   Window
	head     string // mode and target
	key      string
	sent     []string
	back     []string
	wrong    []string
	effects  int // added by the window
	want     int
	runs     int64 // runs of the code under test during the window
	notes    []string
	effectsN bool // effects were counted
}

func (a *account) send(format string, args ...any) {
	a.sent = append(a.sent, fmt.Sprintf("#%d ", len(a.sent)+1)+fmt.Sprintf(format, args...))
}

func (a *account) got(format string, args ...any) {
	a.back = append(a.back, fmt.Sprintf("#%d ", len(a.back)+1)+fmt.Sprintf(format, args...))
}

func (a *account) fail(format string, args ...any) {
	a.wrong = append(a.wrong, fmt.Sprintf(format, args...))
}

func (a *account) note(format string, args ...any) {
	a.notes = append(a.notes, fmt.Sprintf(format, args...))
}

// wantInjected notes when panicked, what came out of the code under test
// (outOf), is not the panic the check injected.
func (a *account) wantInjected(panicked any, outOf string) {
	if _, ok := panicked.(injected); !ok {
		a.note("the injected panic did not come back out of %s", outOf)
	}
}

// wantRolledBack fails a when n effects remained after a crash inside the
// transaction.
func (a *account) wantRolledBack(n int) {
	if n != 0 {
		a.fail("after the crash %d effects remained, want 0: an effect outside the transaction survives the rollback", n)
	}
}

// effectsWant records the effects the window added and fails it when they
// are not want.
func (a *account) effectsWant(added, want int) {
	a.effects, a.want, a.effectsN = added, want, true
	if added != want {
		a.fail("the window added %d effects, want %d", added, want)
	}
}

func (a *account) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s, key %s\n", a.head, keyName(a.key))
	list := func(title string, lines []string) {
		if len(lines) == 0 {
			return
		}
		b.WriteString("  " + title + ":\n")
		for _, l := range lines {
			b.WriteString("    " + l + "\n")
		}
	}
	list("sent", a.sent)
	list("came back", a.back)
	if a.effectsN {
		fmt.Fprintf(&b, "  effects: %d counted, %d expected\n", a.effects, a.want)
	}
	fmt.Fprintf(&b, "  runs of the code under test: %d\n", a.runs)
	list("notes", a.notes)
	list("wrong", a.wrong)
	return strings.TrimRight(b.String(), "\n")
}

// report fails tb for each failed window and returns the check's error.
func report(tb testing.TB, accounts []*account) error {
	var errs []error
	for _, a := range accounts {
		if len(a.wrong) == 0 {
			continue
		}
		we := &WindowError{Window: a.window, Account: a.String()}
		if tb != nil {
			tb.Helper()
			tb.Errorf("%v", we)
		}
		errs = append(errs, we)
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return joined(errs)
}

// joined is errors.Join whose message separates the windows by a blank
// line.
type joined []error

func (j joined) Error() string {
	parts := make([]string, len(j))
	for i, e := range j {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n\n")
}

func (j joined) Unwrap() []error { return j }

// configFailure reports a configuration error on tb and returns it.
func configFailure(tb testing.TB, err error) error {
	if tb != nil {
		tb.Helper()
		tb.Errorf("%v", err)
	}
	return err
}

// shown is a body as an account shows it: quoted, at most maxShown bytes.
func shown(body []byte) string {
	if len(body) == 0 {
		return "(empty body)"
	}
	if len(body) > maxShown {
		return fmt.Sprintf("%q... (%d bytes)", body[:maxShown], len(body))
	}
	return fmt.Sprintf("%q", body)
}
