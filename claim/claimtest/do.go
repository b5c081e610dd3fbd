package claimtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	cfg, err := newConfig(opts)
	switch {
	case err != nil:
		return configFailure(tb, err)
	case fn == nil:
		return configFailure(tb, configErr("CheckDo: nil function"))
	case effects == nil:
		return configFailure(tb, configErr("CheckDo: nil effects function"))
	}
	c := &doCheck{e: e, fn: fn, dups: cfg.duplicates}
	run, skipped := cfg.plan(true)
	for _, w := range skipped {
		if tb != nil {
			tb.Logf("claimtest: window %s does not apply to Do: skipped", w)
		}
	}
	var accounts []*account
	for _, w := range run {
		a := &account{window: w, key: newKey(), head: "Claimer.Do"}
		before, runs := effects(), c.runs.Load()
		c.window(a, effects, before)
		a.runs = c.runs.Load() - runs
		accounts = append(accounts, a)
	}
	return report(tb, accounts)
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
	deadline := time.Now().Add(finalWithin)
	for tries := 1; ; tries++ {
		a := c.call(key, false, false)
		a.tries = tries
		if !a.inProgress() || time.Now().After(deadline) {
			return a
		}
		time.Sleep(retryEvery)
	}
}

func (c *doCheck) window(a *account, effects func() int, before int) {
	switch a.window {
	case Concurrent:
		answers := make([]doAnswer, c.dups)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() {
				<-start
				answers[i] = c.final(a.key)
			})
		}
		close(start)
		wg.Wait()
		executed := 0
		var differ []string
		for i, x := range answers {
			a.send("Do, at once with the others, retried while in progress")
			a.got("%v", x)
			if !x.done() {
				a.fail("call #%d did not execute or replay", i+1)
			} else if !sameResult(answers[0], x) {
				differ = append(differ, fmt.Sprintf("#%d", i+1))
			}
			if x.done() && x.out.Kind == claim.Executed {
				executed++
			}
		}
		if len(differ) > 0 {
			a.fail("the results of calls %s differ from call #1's", strings.Join(differ, ", "))
		}
		if executed != 1 {
			a.fail("%d calls executed, want 1 (the others replay)", executed)
		}
		a.effectsWant(effects()-before, 1)
	case DroppedResponse, RedisEmptied:
		a.send("Do")
		first := c.call(a.key, false, false)
		a.got("%v (dropped: the caller never saw it)", first)
		if a.window == RedisEmptied {
			c.e.flushRedis()
			a.send("Do, same key, after Redis was emptied")
		} else {
			a.send("Do, same key (the retry)")
		}
		retry := c.final(a.key)
		a.got("%v", retry)
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
		a.send("Do")
		first := c.call(a.key, false, false)
		a.got("%v", first)
		a.send("Do, same key, another fingerprint")
		other := c.call(a.key, true, false)
		a.got("%v", other)
		if !errors.Is(other.err, claim.ErrMismatch) {
			a.fail("the other request did not fail with claim.ErrMismatch")
		}
		if !first.done() {
			a.fail("the first call did not execute")
		}
		a.effectsWant(effects()-before, 1)
	case CrashBeforeCommit:
		a.send("Do, a panic injected after fn returned, before COMMIT")
		first := c.call(a.key, false, true)
		a.got("%v", first)
		if _, ok := first.panicked.(injected); !ok {
			a.note("the injected panic did not come back out of Do")
		}
		if n := effects() - before; n != 0 {
			a.fail("after the crash %d effects remained, want 0: an effect outside the transaction survives the rollback", n)
		}
		a.send("Do, same key (the retry: nothing committed, so it runs)")
		retry := c.final(a.key)
		a.got("%v", retry)
		a.send("Do, same key (the next retry)")
		again := c.final(a.key)
		a.got("%v", again)
		switch {
		case !retry.done() || retry.out.Kind != claim.Executed:
			a.fail("the retry did not execute, but nothing had committed")
		case again.out.Kind != claim.Replayed || !sameResult(retry, again):
			a.fail("the next retry did not replay the retry's result")
		}
		a.effectsWant(effects()-before, 1)
	}
}
