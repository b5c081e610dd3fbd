package claimtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// DoFunc is the function [claim.Claimer.Do] runs, on the embedded
// default's transaction type.
type DoFunc = func(ctx context.Context, tx *sql.Tx, op claim.Op) (durable.Result, error)

// operation is the operation of every claim CheckDo makes.
const operation = "claimtest"

// CheckDo runs fn with e's Claimer.Do through every window that applies to
// a transaction (all but panic-after-effect), and reports each window it
// failed on tb with Errorf (tb may be nil). effects returns how many times
// fn's effect happened so far; each call that commits must add one. fn
// must be safe for concurrent use.
//
// Its claims are in tenant "claimtest", operation "claimtest"; the
// mismatch window's second claim has another fingerprint. It returns nil
// when every window passed, an error matching [ErrNotIdempotent]
// otherwise, or one matching [ErrConfig].
func (e *Env) CheckDo(tb testing.TB, fn DoFunc, effects func() int, opts ...Option) error {
	if tb != nil {
		tb.Helper()
	}
	cfg, err := checkConfig("CheckDo", opts, "function", fn == nil, effects)
	if err != nil {
		return configFailure(tb, err)
	}
	c := &doCheck{e: e, fn: fn, dups: cfg.duplicates}
	run, skipped := cfg.plan(true)
	logSkipped(tb, skipped, "to Do")
	return report(tb, runWindows(run, "Claimer.Do", &c.runs, effects, c.window))
}

type doCheck struct {
	e    *Env
	fn   DoFunc
	dups int
	runs atomic.Int64
}

// fingerprints of the request and of the mismatch window's other one.
var (
	fingerprint      = string(canon.Sum([]byte("claimtest"), []byte("request")))
	otherFingerprint = string(canon.Sum([]byte("claimtest"), []byte("other")))
)

// doAnswer is what one call of Do came to.
type doAnswer struct {
	out      claim.Outcome
	err      error
	panicked any
	tries    int
}

func (a doAnswer) inProgress() bool {
	return a.err == nil && a.panicked == nil && a.out.Kind == claim.InProgress
}

func (a doAnswer) done() bool {
	return a.err == nil && a.panicked == nil && (a.out.Kind == claim.Executed || a.out.Kind == claim.Replayed)
}

func (a doAnswer) String() string {
	var s string
	switch {
	case a.panicked != nil:
		s = fmt.Sprintf("panic: %v", a.panicked)
	case a.err != nil:
		s = fmt.Sprintf("error: %v", a.err)
	case a.out.Result != nil:
		s = fmt.Sprintf("%s, %s %d %s", a.out.Kind, a.out.State, a.out.Result.StatusCode, shown(a.out.Result.Body))
	default:
		s = a.out.Kind.String()
	}
	if a.tries > 1 {
		s += fmt.Sprintf(" after %d tries", a.tries)
	}
	return s
}

// sameResult reports whether b carries a's result again.
func sameResult(a, b doAnswer) bool {
	if !a.done() || !b.done() || a.out.State != b.out.State {
		return false
	}
	x, y := a.out.Result, b.out.Result
	return x.StatusCode == y.StatusCode && bytes.Equal(x.Body, y.Body) && x.Version == y.Version &&
		x.ResourceID == y.ResourceID && len(x.Headers) == len(y.Headers) &&
		maps.EqualFunc(x.Headers, y.Headers, slices.Equal)
}

// call runs Do once with key; other uses the other fingerprint, crash
// panics inside the transaction after fn returned.
func (c *doCheck) call(key string, other, crash bool) (a doAnswer) {
	req := claim.Request{Scope: durable.Scope{Tenant: tenant, Operation: operation, Key: key}, Fingerprint: fingerprint}
	if other {
		req.Fingerprint = otherFingerprint
	}
	defer func() {
		if v := recover(); v != nil {
			a = doAnswer{panicked: v, tries: 1}
		}
	}()
	out, err := c.e.Claimer.Do(context.Background(), req, func(ctx context.Context, tx *sql.Tx, op claim.Op) (durable.Result, error) {
		c.runs.Add(1)
		res, err := c.fn(ctx, tx, op)
		if crash {
			panic(injected{"panic after the function returned, before COMMIT"})
		}
		return res, err
	})
	return doAnswer{out: out, err: err, tries: 1}
}

// final calls Do until it is not in progress (for at most finalWithin).
func (c *doCheck) final(key string) doAnswer {
	a, tries := untilFinal(func() doAnswer { return c.call(key, false, false) })
	a.tries = tries
	return a
}

// once records sending what, calls Do once with a's key (other and crash
// as call takes them), and records the answer.
func (c *doCheck) once(a *account, what string, other, crash bool) doAnswer {
	a.send("%s", what)
	x := c.call(a.key, other, crash)
	a.got("%v", x)
	return x
}

// retry records sending what, calls Do with a's key until it is not in
// progress, and records the answer.
func (c *doCheck) retry(a *account, what string) doAnswer {
	a.send("%s", what)
	x := c.final(a.key)
	a.got("%v", x)
	return x
}

func (c *doCheck) window(a *account, effects func() int, before int) {
	switch a.window {
	case Concurrent:
		answers := atOnce(c.dups, func() doAnswer { return c.final(a.key) })
		executed := 0
		for i, x := range answers {
			a.send("Do, at once with the others, retried while in progress")
			a.got("%v", x)
			if !x.done() {
				a.fail("call #%d did not execute or replay", i+1)
			}
			if x.done() && x.out.Kind == claim.Executed {
				executed++
			}
		}
		if differ := numbered(answers, func(x doAnswer) bool { return x.done() && !sameResult(answers[0], x) }); differ != "" {
			a.fail("the results of calls %s differ from call #1's", differ)
		}
		if executed != 1 {
			a.fail("%d calls executed, want 1 (the others replay)", executed)
		}
		a.effectsWant(effects()-before, 1)
	case DroppedResponse, RedisEmptied:
		a.send("Do")
		first := c.call(a.key, false, false)
		a.got("%v (dropped: the caller never saw it)", first)
		what := "Do, same key (the retry)"
		if a.window == RedisEmptied {
			c.e.flushRedis()
			what = "Do, same key, after Redis was emptied"
		}
		retry := c.retry(a, what)
		switch {
		case !first.done() || first.out.Kind != claim.Executed:
			a.fail("the first call did not execute")
		case !retry.done() || retry.out.Kind != claim.Replayed:
			a.fail("the retry was not a replay")
		case !sameResult(first, retry):
			a.fail("the retry did not get the first result")
		}
		a.effectsWant(effects()-before, 1)
	case Mismatch:
		first := c.once(a, "Do", false, false)
		other := c.once(a, "Do, same key, another fingerprint", true, false)
		if !errors.Is(other.err, claim.ErrMismatch) {
			a.fail("the other request did not fail with claim.ErrMismatch")
		}
		if !first.done() {
			a.fail("the first call did not execute")
		}
		a.effectsWant(effects()-before, 1)
	case CrashBeforeCommit:
		first := c.once(a, "Do, a panic injected after fn returned, before COMMIT", false, true)
		a.wantInjected(first.panicked, "Do")
		a.wantRolledBack(effects() - before)
		retry := c.retry(a, "Do, same key (the retry: nothing committed, so it runs)")
		again := c.retry(a, "Do, same key (the next retry)")
		switch {
		case !retry.done() || retry.out.Kind != claim.Executed:
			a.fail("the retry did not execute, but nothing had committed")
		case again.out.Kind != claim.Replayed || !sameResult(retry, again):
			a.fail("the next retry did not replay the retry's result")
		}
		a.effectsWant(effects()-before, 1)
	}
}
