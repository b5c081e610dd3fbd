package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// errDemo is returned when an expectation of the demo failed.
var errDemo = errors.New("deploys: the demo's expectations did not hold")

type demo struct {
	ctx    context.Context
	base   string
	out    io.Writer
	client *http.Client
	failed int
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, "deploys: "+format+"\n", args...) }

func (d *demo) expect(ok bool, format string, args ...any) {
	if !ok {
		d.failed++
		fmt.Fprintf(d.out, "deploys: FAILED: "+format+"\n", args...)
	}
}

type answer struct {
	status   int
	location string
	replayed bool
	body     string
	err      error
}

func (a answer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	s := fmt.Sprintf("%d", a.status)
	if a.location != "" {
		s += " Location " + a.location
	}
	return s
}

func (d *demo) do(method, path, tenant, key, body string) answer {
	req, err := http.NewRequestWithContext(d.ctx, method, d.base+path, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+tenant)
	if key != "" {
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, location: resp.Header.Get("Location"),
		replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: string(b)}
}

// state polls the operation once.
func (d *demo) state(tenant, loc string) (string, answer) {
	a := d.do(http.MethodGet, loc, tenant, "", "")
	var v struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal([]byte(a.body), &v)
	return v.State, a
}

// waitFinished polls loc until the operation is finished.
func (d *demo) waitFinished(tenant, loc string) (states []string, last answer) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && d.ctx.Err() == nil {
		s, a := d.state(tenant, loc)
		if len(states) == 0 || states[len(states)-1] != s {
			states = append(states, s)
		}
		last = a
		if s == "completed" || s == "failed" {
			return states, last
		}
		time.Sleep(250 * time.Millisecond)
	}
	return states, last
}

func newKey() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "deploy-" + hex.EncodeToString(b[:])
}

// runDemo tells the story against the service at base and returns errDemo
// unless every expectation held.
func runDemo[TTx any](ctx context.Context, base string, a *app[TTx], out io.Writer) error {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	defer tr.CloseIdleConnections()
	d := &demo{ctx: ctx, base: base, out: out, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	run := newKey()[7:11]
	acme, globex := "acme-"+run, "globex-"+run
	body := `{"service":"api","version":"1.4.2"}`

	// 1. The first request: 202 and the operation's Location, at once.
	key := newKey()
	start := time.Now()
	first := d.do(http.MethodPost, "/deploys", acme, key, body)
	took := time.Since(start)
	loc := first.location
	d.expect(first.status == http.StatusAccepted && strings.HasPrefix(loc, "/operations/op_"), "first request: %s, want 202 with Location /operations/op_...", first)
	d.expect(took < deployTime, "the first answer took %v, longer than the deploy itself", took.Round(time.Millisecond))
	d.say("1. POST /deploys: %s, in %v (the deploy itself takes %v)", first, took.Round(time.Millisecond), deployTime)

	// 2. Ten concurrent duplicates: the same 202 and Location.
	dups := make([]answer, 10)
	var wg sync.WaitGroup
	for i := range dups {
		wg.Go(func() { dups[i] = d.do(http.MethodPost, "/deploys", acme, key, body) })
	}
	wg.Wait()
	same := 0
	for i, r := range dups {
		d.expect(r.status == http.StatusAccepted && r.location == loc, "duplicate %d: %s, want 202 %s", i+1, r, loc)
		if r.location == loc {
			same++
		}
	}
	d.say("2. 10 concurrent duplicates: %d × 202 with the same Location", same)

	// 3. Polling: processing, then completed.
	states, last := d.waitFinished(acme, loc)
	d.expect(len(states) >= 2 && states[0] == "processing" && states[len(states)-1] == "completed", "polling saw %v, want processing then completed", states)
	d.say("3. GET %s: %s (%s)", loc, strings.Join(states, " → "), strings.TrimSpace(last.body))

	// 4. Another tenant's GET of the Location: 404, as for any unknown id.
	other := d.do(http.MethodGet, loc, globex, "", "")
	d.expect(other.status == http.StatusNotFound, "another tenant's GET: %s, want 404", other)
	d.say("4. another tenant's GET %s: %d", loc, other.status)

	// 5. A retry after completion replays the stored result.
	rep := d.do(http.MethodPost, "/deploys", acme, key, body)
	d.expect(rep.status == http.StatusCreated && rep.replayed && strings.HasPrefix(rep.location, "/deploys/dep_"), "retry after completion: %s replayed=%v, want the stored 201", rep, rep.replayed)
	d.say("5. the retry after completion: %d %s (Idempotent-Replayed: %v)", rep.status, strings.TrimSpace(rep.body), rep.replayed)
	got := d.do(http.MethodGet, rep.location, acme, "", "")
	d.expect(got.status == http.StatusOK, "GET %s: %s, want 200", rep.location, got)
	d.say("   GET %s: %d %s", rep.location, got.status, strings.TrimSpace(got.body))

	// 6. The worker process is shut down mid-deploy (River's
	// StopAndCancel): the deploy is not cut, since the lease bounds the
	// work, not River's context; it finishes once. (A worker that dies is
	// retried by River once its lease expired: claimriver's kill test.)
	key2 := newKey()
	stopped := make(chan string, 1)
	hook := func(ctx context.Context, op string) {
		select {
		case stopped <- op:
			go a.stopWorker(ctx) // the worker process shuts down mid-deploy
		default:
		}
	}
	a.onDeploy.Store(&hook)
	callsBefore, effectsBefore := a.down.calls.Load(), a.down.effects()
	r2 := d.do(http.MethodPost, "/deploys", acme, key2, `{"service":"web","version":"2.0.0"}`)
	d.expect(r2.status == http.StatusAccepted, "second deploy: %s, want 202", r2)
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		d.expect(false, "the worker never started the second deploy")
	}
	a.onDeploy.Store(nil)
	waitStopped(a)
	if err := a.startWorker(ctx); err != nil {
		return err
	}
	states2, last2 := d.waitFinished(acme, r2.location)
	calls, effects := a.down.calls.Load()-callsBefore, a.down.effects()-effectsBefore
	d.expect(len(states2) > 0 && states2[len(states2)-1] == "completed", "after the shutdown the deploy ended %v, want completed", states2)
	d.expect(effects == 1 && calls == 1, "the downstream got %d calls and applied %d deploys for one operation, want 1 and 1", calls, effects)
	d.say("6. the worker process shut down mid-deploy; the deploy was not cut (its lease bounds it, not River's shutdown): %s, %d downstream calls, %d deploy applied (%s)",
		strings.Join(states2, " → "), calls, effects, strings.TrimSpace(last2.body))

	// 7. An incomplete body is refused before the claim: 400 at once,
	// nothing reserved; the corrected body with the same key runs.
	key3 := newKey()
	bad := d.do(http.MethodPost, "/deploys", acme, key3, `{"service":"api"}`)
	d.expect(bad.status == http.StatusBadRequest && strings.Contains(bad.body, `"detail"`), "incomplete body: %s %s, want a 400 problem", bad, bad.body)
	fixed := d.do(http.MethodPost, "/deploys", acme, key3, `{"service":"api","version":"1.4.3"}`)
	d.expect(fixed.status == http.StatusAccepted, "the corrected body with the same key: %s, want 202", fixed)
	states3, _ := d.waitFinished(acme, fixed.location)
	d.expect(len(states3) > 0 && states3[len(states3)-1] == "completed", "the corrected deploy ended %v, want completed", states3)
	d.say("7. an incomplete body: %d (nothing reserved); the corrected body with the same key: %d, then %s", bad.status, fixed.status, strings.Join(states3, " → "))

	if d.failed > 0 {
		return fmt.Errorf("%w: %d failed", errDemo, d.failed)
	}
	d.say("every expectation held")
	return nil
}

// waitStopped waits until the stopped worker is gone.
func waitStopped[TTx any](a *app[TTx]) {
	for range 200 {
		a.mu.Lock()
		gone := a.worker == nil
		a.mu.Unlock()
		if gone {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
