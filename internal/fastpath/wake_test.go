package fastpath_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// TestWatch_WokenByCompleteAndRelease: a watch of a key is woken when its
// holder's result (or marker) is cached and when its lease is released,
// and not by a claim or a renewal; a watch of another key is not woken.
func TestWatch_WokenByCompleteAndRelease(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s, err := fastpath.New(rdb, fastpath.Options{Prefix: prefix, MaxCachedBody: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ref := durable.Scope{Tenant: "t", Operation: "op", Key: "watched"}.Ref(nil)
	other := durable.Scope{Tenant: "t", Operation: "op", Key: "other"}.Ref(nil)
	w, err := s.Watch(ctx, s.Keys(ref))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w2, err := s.Watch(ctx, s.Keys(ref)) // a second waiter shares the subscription
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	woken := func(w *fastpath.Watch) bool {
		select {
		case <-w.C:
			return true
		case <-time.After(2 * time.Second):
			return false
		}
	}
	quiet := func(w *fastpath.Watch) bool {
		select {
		case <-w.C:
			return false
		case <-time.After(100 * time.Millisecond):
			return true
		}
	}
	o := uuid.New()
	r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: "v1:f", Owner: o, Lease: time.Minute})
	if err != nil || r.Status != fastpath.ClaimAcquired {
		t.Fatalf("Claim = %+v, %v", r, err)
	}
	tok := fence.Token{Generation: r.Generation, Owner: o}
	if _, err := s.Renew(ctx, ref, tok, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !quiet(w) {
		t.Fatal("woken by a claim or a renewal")
	}
	// The holder of another key finishes: not ours.
	if _, err := s.Complete(ctx, other, fence.Token{Generation: 1}, "v1:f", durable.Completed, durable.Result{StatusCode: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if !quiet(w) {
		t.Fatal("woken by another key's finish")
	}
	// A lease dropped because the store refused it wakes no one.
	if held, err := s.DropKeys(ctx, s.Keys(ref), tok); err != nil || !held {
		t.Fatalf("DropKeys = %v, %v", held, err)
	}
	if !quiet(w) {
		t.Fatal("woken by a dropped lease")
	}
	r, err = s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: "v1:f", Owner: o, Lease: time.Minute})
	if err != nil || r.Status != fastpath.ClaimAcquired {
		t.Fatalf("Claim = %+v, %v", r, err)
	}
	if held, err := s.Release(ctx, ref, tok); err != nil || !held {
		t.Fatalf("Release = %v, %v", held, err)
	}
	if !woken(w) || !woken(w2) {
		t.Fatal("a release did not wake both watches")
	}
	// A result too large to cache leaves its marker, and wakes too.
	big := durable.Result{StatusCode: 200, Body: make([]byte, 17)}
	if _, err := s.Complete(ctx, ref, fence.Token{Generation: 2}, "v1:f", durable.Completed, big, time.Hour); err != nil {
		t.Fatal(err)
	}
	if !woken(w) || !woken(w2) {
		t.Fatal("a completion did not wake both watches")
	}
	// The same completion again writes nothing and wakes no one.
	if _, err := s.Complete(ctx, ref, fence.Token{Generation: 2}, "v1:f", durable.Completed, big, time.Hour); err != nil {
		t.Fatal(err)
	}
	if !quiet(w) {
		t.Fatal("woken by a completion that changed nothing")
	}
}
