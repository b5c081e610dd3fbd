package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// workflow is an operation of a workflow run through the library's
// Claimer (claim.Lease.Step) on a test database: what a service records
// and the operator then sees with inspect, pending and resolve -step.
type workflow struct {
	d    testDB
	c    *claim.Claimer[pgx.Tx]
	req  claim.Request
	ref  durable.Ref
	runs map[string][]string // step name -> the keys its function ran with
}

func newWorkflow(t *testing.T, d testDB, sc durable.Scope) *workflow {
	t.Helper()
	c, err := claim.New[pgx.Tx](d.store, claim.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := d.store.Ref(sc)
	if err != nil {
		t.Fatal(err)
	}
	return &workflow{d: d, c: c, req: claim.Request{Scope: sc, Fingerprint: "v1"}, ref: ref, runs: map[string][]string{}}
}

// claim claims the operation and wants it acquired.
func (w *workflow) claim(t *testing.T) *claim.Lease {
	t.Helper()
	out, err := w.c.Claim(t.Context(), w.req)
	if err != nil || out.Kind != claim.Acquired {
		t.Fatalf("claim: %+v %v; want acquired", out, err)
	}
	return out.Lease
}

// step runs step name on l: its function records its key and returns
// result, or fails (its effect may have happened) when result is nil.
func (w *workflow) step(t *testing.T, l *claim.Lease, name string, result []byte) ([]byte, error) {
	t.Helper()
	return l.Step(t.Context(), name, func(_ context.Context, key string) ([]byte, error) {
		w.runs[name] = append(w.runs[name], key)
		if result == nil {
			return nil, errors.New(name + ": downstream timed out")
		}
		return result, nil
	})
}

// expire ends the record's lease ago in the past, by the database's clock,
// as if its worker had died (test setup, not the command's SQL).
func (w *workflow) expire(t *testing.T, ago string) {
	t.Helper()
	if err := w.d.store.InTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE `+w.d.schema+`.idempotency_requests SET lease_expires_at = clock_timestamp() - $1::interval
			WHERE tenant_id = $2 AND operation = $3 AND key_hash = $4`, ago, w.ref.Tenant, w.ref.Operation, w.ref.KeyHash[:])
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// stoppedAtCharge runs reserve, then charge, whose function fails after
// its effect may have happened, and leaves the operation uncertain at
// charge: marked uncertain by its worker (charge stays started), or with
// takeover, by a retry that took over after the worker died and found
// charge unfinished (charge is then marked uncertain).
func stoppedAtCharge(t *testing.T, d testDB, sc durable.Scope, takeover bool) *workflow {
	t.Helper()
	w := newWorkflow(t, d, sc)
	l := w.claim(t)
	if _, err := w.step(t, l, "reserve", []byte("did reserve")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.step(t, l, "charge", nil); err == nil {
		t.Fatal("charge did not fail")
	}
	if !takeover {
		if err := l.MarkUncertain(t.Context()); err != nil {
			t.Fatal(err)
		}
		return w
	}
	w.expire(t, "1 second")
	l = w.claim(t)
	if res, err := w.step(t, l, "reserve", []byte("ran again")); err != nil || string(res) != "did reserve" {
		t.Fatalf("reserve on the takeover = %q %v", res, err)
	}
	if _, err := w.step(t, l, "charge", []byte("ran again")); !errors.Is(err, claim.ErrStepUncertain) {
		t.Fatalf("charge on the takeover = %v; want ErrStepUncertain", err)
	}
	return w
}

// resume is the next retry of the request: it takes the operation over
// and runs reserve, charge and receipt, returning their results.
func (w *workflow) resume(t *testing.T) []string {
	t.Helper()
	l := w.claim(t)
	var got []string
	for _, name := range []string{"reserve", "charge", "receipt"} {
		res, err := w.step(t, l, name, []byte("did "+name))
		if err != nil {
			t.Fatalf("step %s on the resume: %v", name, err)
		}
		got = append(got, string(res))
	}
	if err := l.Complete(t.Context(), durable.Result{StatusCode: 201, Body: []byte("done"), Version: 1}); err != nil {
		t.Fatal(err)
	}
	return got
}

func (w *workflow) record(t *testing.T) durable.Record {
	t.Helper()
	rec, err := w.d.store.Get(t.Context(), w.ref)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func (w *workflow) steps(t *testing.T) []durable.Step {
	t.Helper()
	steps, err := w.d.store.Steps(t.Context(), w.ref, true)
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

// stepResolutions returns the operation's rows of the resolutions table:
// "state status generation operator reason".
func stepResolutions(t *testing.T, d testDB, id string) []string {
	t.Helper()
	var got []string
	err := d.store.InTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT state, status_code, generation, operator, reason FROM `+d.schema+`.idempotency_requests_resolutions WHERE operation_id = $1 ORDER BY generation`, id)
		if err != nil {
			return err
		}
		for rows.Next() {
			var state, operator, reason string
			var status int
			var gen int64
			if err := rows.Scan(&state, &status, &gen, &operator, &reason); err != nil {
				return err
			}
			got = append(got, fmt.Sprintf("%s %d %d %s %s", state, status, gen, operator, reason))
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// unchanged fails unless the operation is as before: its state, token and
// steps, and no resolution recorded.
func (w *workflow) unchanged(t *testing.T, what string, before durable.Record, beforeSteps []durable.Step) {
	t.Helper()
	got := w.record(t)
	if got.State != before.State || got.Token != before.Token {
		t.Fatalf("%s: the record is now %s at %v; want %s at %v, untouched", what, got.State, got.Token, before.State, before.Token)
	}
	steps := w.steps(t)
	if len(steps) != len(beforeSteps) {
		t.Fatalf("%s: steps %+v; want %+v", what, steps, beforeSteps)
	}
	for i := range steps {
		if steps[i].State != beforeSteps[i].State || steps[i].Generation != beforeSteps[i].Generation {
			t.Fatalf("%s: step %d is now %+v; want %+v", what, i, steps[i], beforeSteps[i])
		}
	}
	if r := stepResolutions(t, w.d, w.ref.OperationID()); len(r) != 0 {
		t.Fatalf("%s: recorded resolutions %q", what, r)
	}
}

// inspect lists a workflow's steps (seq, name, state, attempts,
// generation, times, result size) and the step the operation stopped at,
// without a step's result, and prints the results only with
// -step-results: quoted (escaped), in hex when not UTF-8, bounded. Never
// the tenant or the key. pending names the step each operation stopped at.
func TestInspectAndPendingShowSteps(t *testing.T) {
	d := newDB(t, nil)
	ctx := context.Background()
	const tenant, op = "tenant-private-4711", "POST /payments"
	sc := durable.Scope{Tenant: tenant, Operation: op, Key: "raw-key-4f9c2e81"}
	// A result holding personal data, and a terminal escape sequence.
	const account, email = "DE89370400440532013000", "ana.lopez@example.com"
	personal := "account " + account + " of " + email + "\x1b[2J"
	blob := []byte{0xff, 0x00, 0x1b, 0x80}
	long := strings.Repeat("é", 1500) // 3000 bytes of UTF-8 text

	w := newWorkflow(t, d, sc)
	l := w.claim(t)
	for _, s := range []struct {
		name string
		res  []byte
	}{{"reserve", []byte(personal)}, {"fetch.blob", blob}, {"render_pdf", []byte(long)}, {"charge", nil}} {
		if _, err := w.step(t, l, s.name, s.res); (err != nil) != (s.res == nil) {
			t.Fatalf("step %s: %v", s.name, err)
		}
	}
	if err := l.MarkUncertain(ctx); err != nil {
		t.Fatal(err)
	}
	gen := w.record(t).Token.Generation
	id := w.ref.OperationID()
	secrets := []string{tenant, sc.Key, account, email, "\x1b", "\xff"}
	args := d.cmd("inspect", "-tenant", tenant, "-operation", op, "-key", sc.Key)

	code, out, errs := oncekey(t, "", args...)
	want(t, "inspect", code, 0, out, errs)
	noSecrets(t, "inspect", out, append(secrets, "did ", "ééé")...)
	if !strings.Contains(out, fmt.Sprintf("stopped at step  charge (seq 3, started; attempts 1; key %s/charge)", id)) ||
		!strings.Contains(out, "oncekey resolve -step charge -happened -step-result R | -not-happened") {
		t.Fatalf("inspect does not say it stopped at charge:\n%s", out)
	}
	rows := []string{
		fmt.Sprintf(`0 +reserve +finished +no +1 +%d +\S+ +\S+ +%d bytes`, gen, len(personal)),
		fmt.Sprintf(`1 +fetch\.blob +finished +no +1 +%d +\S+ +\S+ +4 bytes`, gen),
		fmt.Sprintf(`2 +render_pdf +finished +no +1 +%d +\S+ +\S+ +3000 bytes`, gen),
		fmt.Sprintf(`3 +charge +started +no +1 +%d +\d{4}-\d\d-\d\dT\S+Z +- +-\n`, gen),
	}
	if !strings.Contains(out, "steps (4):") || !strings.Contains(out, "SEQ  NAME") {
		t.Fatalf("inspect has no steps table:\n%s", out)
	}
	for _, r := range rows {
		if !regexp.MustCompile(`\n +` + r).MatchString(out) {
			t.Fatalf("inspect: no step row %q:\n%s", r, out)
		}
	}
	if strings.Contains(out, "step results") {
		t.Fatalf("inspect prints step results without -step-results:\n%s", out)
	}

	// -step-results: quoted, hex, bounded; still no tenant or key, and no
	// raw escape reaches the terminal.
	code, out, errs = oncekey(t, "", append(args, "-step-results")...)
	want(t, "inspect -step-results", code, 0, out, errs)
	noSecrets(t, "inspect -step-results", out, tenant, sc.Key, "\x1b", "\xff")
	for _, s := range []string{
		"  reserve: " + strconv.Quote(personal) + "\n",
		"  fetch.blob: hex ff001b80\n",
		"  render_pdf: \"" + strings.Repeat("é", 512) + "\" ... (the first 1024 of 3000 bytes)\n",
	} {
		if !strings.Contains(out, s) {
			t.Fatalf("inspect -step-results does not show %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "  charge: ") {
		t.Fatalf("inspect -step-results shows a result for the unfinished charge:\n%s", out)
	}

	// -json: the steps and the current one, results only with -step-results.
	var rec recordJSON
	code, out, errs = oncekey(t, "", append(args, "-json")...)
	want(t, "inspect -json", code, 0, out, errs)
	noSecrets(t, "inspect -json", out, append(secrets, "did ", "ééé", "ana.lopez")...)
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Steps) != 4 || rec.Step == nil || rec.Step.Name != "charge" || rec.Step.Seq != 3 || rec.Step.State != "started" || rec.Step.Key != id+"/charge" {
		t.Fatalf("inspect -json steps %+v, step %+v", rec.Steps, rec.Step)
	}
	for i, name := range []string{"reserve", "fetch.blob", "render_pdf", "charge"} {
		s := rec.Steps[i]
		if s.Seq != i || s.Name != name || s.Attempts != 1 || s.Generation != gen || s.StartedAt.IsZero() || s.ResultText != nil || s.ResultHex != nil || (s.FinishedAt == nil) != (name == "charge") {
			t.Fatalf("inspect -json step %d = %+v", i, s)
		}
	}
	if rec.Steps[0].ResultBytes != len(personal) || rec.Steps[2].ResultBytes != 3000 {
		t.Fatalf("inspect -json result sizes %+v", rec.Steps)
	}
	code, out, errs = oncekey(t, "", append(args, "-json", "-step-results")...)
	want(t, "inspect -json -step-results", code, 0, out, errs)
	rec = recordJSON{}
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatal(err)
	}
	if s := rec.Steps[0]; s.ResultText == nil || *s.ResultText != personal || s.ResultTruncated {
		t.Fatalf("inspect -json -step-results reserve = %+v", s)
	}
	if s := rec.Steps[1]; s.ResultHex == nil || *s.ResultHex != "ff001b80" || s.ResultText != nil {
		t.Fatalf("inspect -json -step-results fetch.blob = %+v", s)
	}
	if s := rec.Steps[2]; s.ResultText == nil || *s.ResultText != strings.Repeat("é", 512) || !s.ResultTruncated {
		t.Fatalf("inspect -json -step-results render_pdf = %+v", s)
	}
	if s := rec.Steps[3]; s.ResultText != nil || s.ResultHex != nil {
		t.Fatalf("inspect -json -step-results charge = %+v", s)
	}

	// The other operations pending lists: one uncertain at a step a
	// takeover found unfinished, one whose worker died at a step (stale),
	// one without steps.
	took := stoppedAtCharge(t, d, durable.Scope{Tenant: tenant, Operation: op, Key: "raw-key-took-over"}, true)
	dead := newWorkflow(t, d, durable.Scope{Tenant: tenant, Operation: op, Key: "raw-key-dead-worker"})
	if _, err := dead.step(t, dead.claim(t), "notify", nil); err == nil {
		t.Fatal("notify did not fail")
	}
	dead.expire(t, "10 minutes")
	plain := uncertainOp(t, d, "raw-key-no-steps")

	code, out, errs = oncekey(t, "", d.cmd("pending")...)
	want(t, "pending", code, 0, out, errs)
	noSecrets(t, "pending", out, tenant, sc.Key, "raw-key-", account)
	if !regexp.MustCompile(`AGE +STEP\n`).MatchString(out) {
		t.Fatalf("pending has no STEP column:\n%s", out)
	}
	for rid, step := range map[string]string{
		id:                      "charge (seq 3, started)",
		took.ref.OperationID():  "charge (seq 1, uncertain)",
		dead.ref.OperationID():  "notify (seq 0, started)",
		plain.Ref.OperationID(): "-",
	} {
		if !regexp.MustCompile(regexp.QuoteMeta(rid) + `.* ` + regexp.QuoteMeta(step) + `\n`).MatchString(out) {
			t.Fatalf("pending does not show %s at step %q:\n%s", rid, step, out)
		}
	}
	code, out, errs = oncekey(t, "", d.cmd("pending", "-json")...)
	want(t, "pending -json", code, 0, out, errs)
	noSecrets(t, "pending -json", out, tenant, sc.Key, "raw-key-")
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r recordJSON
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("pending -json: %v\n%s", err, out)
		}
		got[r.OperationID] = "-"
		if r.Step != nil {
			got[r.OperationID] = fmt.Sprintf("%s %d %s %s", r.Step.Name, r.Step.Seq, r.Step.State, r.Step.Key)
		}
	}
	if wantSteps := map[string]string{
		id:                      "charge 3 started " + id + "/charge",
		took.ref.OperationID():  "charge 1 uncertain " + took.ref.OperationID() + "/charge",
		dead.ref.OperationID():  "notify 0 started " + dead.ref.OperationID() + "/notify",
		plain.Ref.OperationID(): "-",
	}; fmt.Sprint(got) != fmt.Sprint(wantSteps) {
		t.Fatalf("pending -json steps %v; want %v", got, wantSteps)
	}

	// inspect of the dead worker's: stopped, its lease expired; of a live
	// one: running its step; of one without steps: none.
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", tenant, "-id", dead.ref.OperationID())...)
	want(t, "inspect the dead worker's", code, 0, out, errs)
	if !strings.Contains(out, "stopped at step  notify (seq 0, started, its worker's lease expired;") {
		t.Fatalf("inspect the dead worker's:\n%s", out)
	}
	live := newWorkflow(t, d, durable.Scope{Tenant: tenant, Operation: op, Key: "raw-key-live"})
	if _, err := live.step(t, live.claim(t), "notify", nil); err == nil {
		t.Fatal("notify did not fail")
	}
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", tenant, "-operation", op, "-key", "raw-key-live")...)
	want(t, "inspect a live one", code, 0, out, errs)
	if !strings.Contains(out, "running step     notify (seq 0, started;") || strings.Contains(out, "stopped at") || strings.Contains(out, "settle it") {
		t.Fatalf("inspect a live one:\n%s", out)
	}
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", "acme", "-id", plain.Ref.OperationID())...)
	want(t, "inspect one without steps", code, 0, out, errs)
	if !strings.HasSuffix(out, "\nsteps: none\n") || strings.Contains(out, "step ") {
		t.Fatalf("inspect one without steps:\n%s", out)
	}
}

// resolve -step settles the step the operation stopped at, through the
// store's SettleStep after adopting the record: -happened records the
// operator's result, which the next retry gets without running the step;
// -not-happened has the next retry run it again with the same key. The
// reason is recorded as step-happened:NAME / step-not-happened:NAME.
func TestResolveStep(t *testing.T) {
	d := newDB(t, nil)
	ctx := context.Background()
	const tenant, op = "tenant-private-4711", "POST /payments"

	t.Run("happened", func(t *testing.T) {
		sc := durable.Scope{Tenant: tenant, Operation: op, Key: "raw-key-happened"}
		w := stoppedAtCharge(t, d, sc, false)
		before := w.record(t)
		code, out, errs := oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", sc.Key,
			"-step", "charge", "-happened", "-step-result", "charged ch_1", "-reason", "PSP shows ch_1 captured", "-operator", "ana")...)
		want(t, "resolve -step -happened", code, 0, out, errs)
		noSecrets(t, "resolve -step -happened", out, tenant, sc.Key, "charged ch_1")
		rec := w.record(t)
		id := w.ref.OperationID()
		if rec.State != durable.Processing || rec.Token.Generation <= before.Token.Generation || rec.LeaseRemaining > 0 {
			t.Fatalf("after resolve -step: %s at %v, lease %v; want processing, adopted above %d, its lease run out", rec.State, rec.Token, rec.LeaseRemaining, before.Token.Generation)
		}
		for _, s := range []string{
			fmt.Sprintf("settled step charge (seq 1) of %s as happened (result 12 bytes) at generation %d; recorded in %s.idempotency_requests_resolutions as step-happened:charge\n", id, rec.Token.Generation, d.schema),
			"the next retry of the same request takes it over and resumes: charge returns the recorded result without running, and the steps after it run.",
		} {
			if !strings.Contains(out, s) {
				t.Fatalf("resolve -step -happened does not say %q:\n%s", s, out)
			}
		}
		if r := stepResolutions(t, d, id); !slices.Equal(r, []string{fmt.Sprintf("step-happened:charge 0 %d ana PSP shows ch_1 captured", rec.Token.Generation)}) {
			t.Fatalf("recorded resolutions %q", r)
		}
		if s := w.steps(t); len(s) != 2 || s[1].State != durable.StepFinished || string(s[1].Result) != "charged ch_1" {
			t.Fatalf("steps after resolve -step -happened: %+v", s)
		}
		// Settled once: nothing to settle again.
		code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-id", id, "-stale", "0", "-step", "charge", "-not-happened", "-reason", "again", "-operator", "ana")...)
		want(t, "resolve -step twice", code, 1, out, errs)
		if !strings.Contains(errs, "oncekey resolve: resolve: operation "+id+" is processing and stopped at no step") {
			t.Fatalf("resolve -step twice: %q", errs)
		}
		// The retry resumes: reserve and charge return their results
		// without running, receipt runs.
		if got := w.resume(t); !slices.Equal(got, []string{"did reserve", "charged ch_1", "did receipt"}) {
			t.Fatalf("resume = %q", got)
		}
		if len(w.runs["reserve"]) != 1 || len(w.runs["charge"]) != 1 || len(w.runs["receipt"]) != 1 {
			t.Fatalf("runs %v; want each step once", w.runs)
		}
	})

	t.Run("not-happened", func(t *testing.T) {
		sc := durable.Scope{Tenant: tenant, Operation: op, Key: "raw-key-not-happened"}
		w := stoppedAtCharge(t, d, sc, true) // charge marked uncertain by the takeover
		id := w.ref.OperationID()
		code, out, errs := oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-id", id,
			"-step", "charge", "-not-happened", "-reason", "PSP never saw it", "-operator", "bo")...)
		want(t, "resolve -step -not-happened", code, 0, out, errs)
		noSecrets(t, "resolve -step -not-happened", out, tenant, sc.Key)
		rec := w.record(t)
		for _, s := range []string{
			fmt.Sprintf("settled step charge (seq 1) of %s as not happened at generation %d;", id, rec.Token.Generation),
			"as step-not-happened:charge\n",
			fmt.Sprintf("resumes: charge runs again with its key %s/charge (the steps before it return their recorded results).", id),
		} {
			if !strings.Contains(out, s) {
				t.Fatalf("resolve -step -not-happened does not say %q:\n%s", s, out)
			}
		}
		if r := stepResolutions(t, d, id); !slices.Equal(r, []string{fmt.Sprintf("step-not-happened:charge 0 %d bo PSP never saw it", rec.Token.Generation)}) {
			t.Fatalf("recorded resolutions %q", r)
		}
		if got := w.resume(t); !slices.Equal(got, []string{"did reserve", "did charge", "did receipt"}) {
			t.Fatalf("resume = %q", got)
		}
		if k := w.runs["charge"]; len(k) != 2 || k[0] != k[1] || k[0] != id+"/charge" || len(w.runs["reserve"]) != 1 {
			t.Fatalf("runs %v; want charge run again with its key, reserve once", w.runs)
		}
	})

	t.Run("from a file, a stale worker's step", func(t *testing.T) {
		sc := durable.Scope{Tenant: tenant, Operation: op, Key: "raw-key-file"}
		w := newWorkflow(t, d, sc)
		if _, err := w.step(t, w.claim(t), "charge", nil); err == nil {
			t.Fatal("charge did not fail")
		}
		w.expire(t, "10 minutes")
		res := []byte{0x00, 0xff, '\n'}
		f := filepath.Join(t.TempDir(), "result")
		if err := os.WriteFile(f, res, 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errs := oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", sc.Key,
			"-step", "charge", "-happened", "-step-result-file", f, "-reason", "found it", "-operator", "ana")...)
		want(t, "resolve -step -step-result-file", code, 0, out, errs)
		if s := w.steps(t); len(s) != 1 || s[0].State != durable.StepFinished || string(s[0].Result) != string(res) {
			t.Fatalf("steps after resolve -step-result-file: %+v", s)
		}
		if got, _ := d.store.Get(ctx, w.ref); got.State != durable.Processing {
			t.Fatalf("after resolve -step: %+v", got)
		}
	})
}

// Every refusal of resolve -step: bad flag combinations are usage errors
// (exit 2) and read or write nothing; an operation that is not stopped at
// that step, stopped at none, finished, held by a live worker or stale
// less than -stale is refused (exit 1) and left as it was.
func TestResolveStepRefusals(t *testing.T) {
	d := newDB(t, nil)
	const tenant, op = "acme", "POST /charges"
	sc := durable.Scope{Tenant: tenant, Operation: op, Key: "k-refusals"}
	w := stoppedAtCharge(t, d, sc, false)
	before, beforeSteps := w.record(t), w.steps(t)
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, storeapi.MaxStepResult+1), 0o600); err != nil {
		t.Fatal(err)
	}
	base := d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", sc.Key, "-reason", "r", "-operator", "ana")
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"-step", "charge"}, "-step needs -happened (its effect took place"},
		{[]string{"-step", "charge", "-happened", "-not-happened"}, "give -happened or -not-happened, not both"},
		{[]string{"-step", "charge", "-happened"}, "-happened needs the step's result"},
		{[]string{"-step", "charge", "-not-happened", "-step-result", "x"}, "-not-happened takes no result"},
		{[]string{"-step", "charge", "-not-happened", "-step-result-file", big}, "-not-happened takes no result"},
		{[]string{"-step", "charge", "-happened", "-step-result", "x", "-step-result-file", big}, "give -step-result or -step-result-file, not both"},
		{[]string{"-step", "charge", "-happened", "-step-result-file", filepath.Join(t.TempDir(), "none")}, "-step-result-file: open"},
		{[]string{"-step", "charge", "-happened", "-step-result-file", big}, "the step result is 1048577 bytes: at most 1048576 (1 MiB)"},
		{[]string{"-step", "has space", "-not-happened"}, `-step "has space" is not a step name`},
		{[]string{"-step", "", "-not-happened"}, `-step "" is not a step name`},
		{[]string{"-step", "charge", "-not-happened", "-as", "completed"}, "not -as (which settles the whole operation)"},
		{[]string{"-step", "charge", "-not-happened", "-format", "http"}, "not -format"},
		{[]string{"-step", "charge", "-happened", "-step-result", "x", "-status", "200"}, "not -status"},
		{[]string{"-happened", "-step-result", "x", "-format", "http", "-as", "completed", "-status", "200"}, "-happened goes with -step NAME"},
		{[]string{"-not-happened", "-format", "http", "-as", "completed", "-status", "200"}, "-not-happened goes with -step NAME"},
		{[]string{"-step-result", "x", "-format", "http", "-as", "completed", "-status", "200"}, "-step-result goes with -step NAME"},
	} {
		code, out, errs := oncekey(t, "", append(append([]string{}, base...), tc.args...)...)
		want(t, strings.Join(tc.args, " "), code, 2, out, errs)
		if !strings.HasPrefix(errs, "oncekey resolve: ") || !strings.Contains(errs, tc.msg) || !strings.Contains(errs, "(see oncekey resolve -h)") {
			t.Errorf("%q: stderr %q does not say %q", tc.args, errs, tc.msg)
		}
		w.unchanged(t, strings.Join(tc.args, " "), before, beforeSteps)
	}
	// Without -reason, or without an operator: usage errors too.
	code, out, errs := oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", sc.Key, "-operator", "ana", "-step", "charge", "-not-happened")...)
	want(t, "resolve -step without -reason", code, 2, out, errs)
	if !strings.Contains(errs, "-reason is required") {
		t.Fatalf("resolve -step without -reason: %q", errs)
	}
	t.Setenv("USER", "")
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", sc.Key, "-reason", "r", "-step", "charge", "-not-happened")...)
	want(t, "resolve -step without an operator", code, 2, out, errs)
	if !strings.Contains(errs, "-operator is required") {
		t.Fatalf("resolve -step without an operator: %q", errs)
	}
	w.unchanged(t, "no reason, no operator", before, beforeSteps)

	id := w.ref.OperationID()
	refused := func(what string, args []string, msg string) {
		t.Helper()
		code, out, errs := oncekey(t, "", append(append([]string{}, base...), args...)...)
		want(t, what, code, 1, out, errs)
		if !strings.HasPrefix(errs, "oncekey resolve: resolve: ") || !strings.Contains(errs, msg) {
			t.Fatalf("%s: stderr %q does not say %q", what, errs, msg)
		}
		noSecrets(t, what, out+errs, sc.Key)
	}
	// Stopped at charge: another step, finished or unknown, is refused.
	refused("another step", []string{"-step", "reserve", "-happened", "-step-result", "x"},
		"operation "+id+" is stopped at step charge (seq 1, started), not reserve (seq 0, finished): nothing written")
	w.unchanged(t, "another step", before, beforeSteps)
	refused("an unknown step", []string{"-step", "refund", "-not-happened"}, "not refund (not among its steps): nothing written")
	w.unchanged(t, "an unknown step", before, beforeSteps)

	// Uncertain without steps: stopped at none.
	plain := uncertainOp(t, d, "k-no-steps")
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", "k-no-steps", "-reason", "r", "-operator", "ana", "-step", "charge", "-not-happened")...)
	want(t, "no steps", code, 1, out, errs)
	if !strings.Contains(errs, "is uncertain and stopped at no step (none is started and unfinished): nothing written; settle the whole operation with -as and -format instead") {
		t.Fatalf("no steps: %q", errs)
	}
	untouched(t, "no steps", d, plain, durable.Uncertain)

	// A live worker at its step: not adoptable.
	live := newWorkflow(t, d, durable.Scope{Tenant: tenant, Operation: op, Key: "k-live"})
	if _, err := live.step(t, live.claim(t), "charge", nil); err == nil {
		t.Fatal("charge did not fail")
	}
	liveBefore, liveSteps := live.record(t), live.steps(t)
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", "k-live", "-reason", "r", "-operator", "ana", "-step", "charge", "-not-happened")...)
	want(t, "a live worker", code, 1, out, errs)
	if !strings.Contains(errs, "is processing and not adoptable (a live lease: its worker is still at step charge") {
		t.Fatalf("a live worker: %q", errs)
	}
	live.unchanged(t, "a live worker", liveBefore, liveSteps)
	// Its lease expired a moment ago: less than -stale, refused.
	live.expire(t, "1 second")
	liveBefore = live.record(t)
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", "k-live", "-reason", "r", "-operator", "ana", "-step", "charge", "-not-happened")...)
	want(t, "not stale yet", code, 1, out, errs)
	if !strings.Contains(errs, "expired less than -stale 5m0s ago") {
		t.Fatalf("not stale yet: %q", errs)
	}
	live.unchanged(t, "not stale yet", liveBefore, liveSteps)

	// A finished operation: nothing to settle.
	done := newWorkflow(t, d, durable.Scope{Tenant: tenant, Operation: op, Key: "k-done"})
	l := done.claim(t)
	if _, err := done.step(t, l, "charge", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(t.Context(), durable.Result{StatusCode: 200}); err != nil {
		t.Fatal(err)
	}
	doneBefore, doneSteps := done.record(t), done.steps(t)
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", "k-done", "-reason", "r", "-operator", "ana", "-step", "charge", "-not-happened")...)
	want(t, "a finished operation", code, 1, out, errs)
	if !strings.Contains(errs, "is completed: it is not stopped at a step; nothing written") {
		t.Fatalf("a finished operation: %q", errs)
	}
	done.unchanged(t, "a finished operation", doneBefore, doneSteps)

	// The help says how.
	code, out, errs = oncekey(t, "", "resolve", "-h")
	want(t, "resolve -h", code, 0, out, errs)
	for _, s := range []string{"-step NAME (-happened (-step-result R | -step-result-file F) | -not-happened)", "-not-happened", "-step-result-file", "step-happened:NAME"} {
		if !strings.Contains(out, s) {
			t.Fatalf("resolve -h does not say %q:\n%s", s, out)
		}
	}
	code, out, errs = oncekey(t, "", "inspect", "-h")
	want(t, "inspect -h", code, 0, out, errs)
	if !strings.Contains(out, "-step-results") {
		t.Fatalf("inspect -h does not document -step-results:\n%s", out)
	}
}

// On a schema without migration 008 (no steps table), inspect and pending
// work and show no steps; resolve -step says to run migrate up.
func TestStepsNeedMigration008(t *testing.T) {
	d := newDB(t, nil)
	w := uncertainOp(t, d, "k-008")
	var out, errs string
	var code int
	for !strings.Contains(out, "008_steps") {
		code, out, errs = oncekey(t, "", d.cmd("migrate", "-yes", "down")...)
		want(t, "migrate down", code, 0, out, errs)
		if strings.Contains(out, "version 7 ") || strings.Contains(out, "version 6 ") {
			t.Fatalf("migrate down went past 008_steps: %s", out)
		}
	}
	code, out, errs = oncekey(t, "", d.cmd("pending")...)
	want(t, "pending without 008", code, 0, out, errs)
	if !regexp.MustCompile(regexp.QuoteMeta(w.Ref.OperationID()) + `.* -\n`).MatchString(out) {
		t.Fatalf("pending without 008:\n%s", out)
	}
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", "acme", "-id", w.Ref.OperationID())...)
	want(t, "inspect without 008", code, 0, out, errs)
	if !strings.Contains(out, "steps: none (this schema has no steps table: migration 008 is not applied)") {
		t.Fatalf("inspect without 008:\n%s", out)
	}
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", "acme", "-id", w.Ref.OperationID(), "-step", "charge", "-not-happened", "-reason", "r", "-operator", "ana")...)
	want(t, "resolve -step without 008", code, 1, out, errs)
	if !strings.Contains(errs, "the table "+d.schema+".idempotency_requests_steps does not exist") || !strings.Contains(errs, "run oncekey migrate up -schema "+d.schema) {
		t.Fatalf("resolve -step without 008: %q", errs)
	}
	untouched(t, "resolve -step without 008", d, w, durable.Uncertain)
}
