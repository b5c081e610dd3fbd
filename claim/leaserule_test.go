package claim_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// wantInvalidLease fails unless err is the lease rule's error: it matches
// ErrInvalidLease and ErrConfig, not ErrInvalidScope, and its message has
// the package's prefix once.
func wantInvalidLease(t *testing.T, what string, err error) {
	t.Helper()
	switch {
	case !errors.Is(err, claim.ErrInvalidLease) || !errors.Is(err, claim.ErrConfig):
		t.Errorf("%s: err = %v, want one matching ErrInvalidLease and ErrConfig", what, err)
	case errors.Is(err, claim.ErrInvalidScope):
		t.Errorf("%s: err = %v also matches ErrInvalidScope", what, err)
	case strings.Count(err.Error(), "claim:") != 1 || strings.Contains(err.Error(), "durable:"):
		t.Errorf("%s: message %q repeats a prefix", what, err)
	}
}

// TestLeaseRule_New: the Claimer's lease (WithLease) follows the lease
// rule, checked by New: zero is the default, negative and below 100ms are
// errors, and so are a lease longer than a retention or not longer than
// an explicit start margin.
func TestLeaseRule_New(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed)
	for name, opts := range map[string][]claim.Option{
		"negative":            {claim.WithLease(-time.Second)},
		"1ms":                 {claim.WithLease(time.Millisecond)},
		"below the floor":     {claim.WithLease(99 * time.Millisecond)},
		"48h":                 {claim.WithLease(48 * time.Hour)},
		"retention":           {claim.WithLease(time.Minute), claim.WithRetention(30 * time.Second)},
		"operation retention": {claim.WithLease(time.Minute), claim.WithOperationRetention("POST /orders", 30*time.Second)},
		"margin":              {claim.WithLease(time.Second), claim.WithStartMargin(time.Second)},
	} {
		_, err := claim.New[pgx.Tx](e.store, opts...)
		wantInvalidLease(t, name, err)
	}
	for name, tc := range map[string]struct {
		opt  claim.Option
		want time.Duration
	}{
		"zero is the default": {claim.WithLease(0), 30 * time.Second},
		"the floor":           {claim.WithLease(100 * time.Millisecond), 100 * time.Millisecond},
		"the retention":       {claim.WithLease(24 * time.Hour), 24 * time.Hour},
	} {
		c, err := claim.New[pgx.Tx](e.store, tc.opt)
		if err != nil {
			t.Errorf("%s: New = %v", name, err)
			continue
		}
		if got := c.Driver().Lease(); got != tc.want {
			t.Errorf("%s: lease = %v, want %v", name, got, tc.want)
		}
	}
}

// TestLeaseRule_Request: a Request.Lease follows the same rule on every
// path (Claim, Do, DoTx), with the same error, before anything is
// reserved; zero is the Claimer's lease.
func TestLeaseRule_Request(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed)
	paths := map[string]func(r claim.Request) (claim.Outcome, error){
		"Claim": func(r claim.Request) (claim.Outcome, error) { return e.c.Claim(t.Context(), r) },
		"Do": func(r claim.Request) (claim.Outcome, error) {
			return e.c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
				t.Errorf("Do ran fn under lease %v", r.Lease)
				return result("ran"), nil
			})
		},
		"DoTx": func(r claim.Request) (claim.Outcome, error) {
			tx, err := e.pool.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			out, _, err := e.c.DoTx(t.Context(), tx, r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
				t.Errorf("DoTx ran fn under lease %v", r.Lease)
				return result("ran"), nil
			})
			return out, err
		},
	}
	for path, call := range paths {
		for _, lease := range []time.Duration{-time.Second, time.Nanosecond, time.Millisecond, 99 * time.Millisecond, 48 * time.Hour} {
			r := req("bad-"+path+"-"+lease.String(), "v1:a")
			r.Lease = lease
			_, err := call(r)
			wantInvalidLease(t, path+" with Request.Lease "+lease.String(), err)
			if !strings.Contains(err.Error(), "Request.Lease") {
				t.Errorf("%s: message %q does not name Request.Lease", path, err)
			}
			if _, err := e.store.Get(t.Context(), e.ref(r)); !errors.Is(err, durable.ErrNotFound) {
				t.Errorf("%s with Request.Lease %v: record %v, want none (nothing reserved)", path, lease, err)
			}
		}
	}
	// Zero is the Claimer's lease (30s), the floor is accepted.
	r := req("zero", "v1:a")
	out := mustClaim(t, e.c, r, claim.Acquired)
	if rem := time.Until(out.Lease.Deadline()); rem < 25*time.Second || rem > 30*time.Second {
		t.Errorf("Request.Lease 0: %v left, want the Claimer's 30s", rem)
	}
	r = req("floor", "v1:a")
	r.Lease = 100 * time.Millisecond
	if rem := time.Until(mustClaim(t, e.c, r, claim.Acquired).Lease.Deadline()); rem > 100*time.Millisecond {
		t.Errorf("Request.Lease 100ms: %v left", rem)
	}
}

// TestLeaseRule_Adapter: the rule as an adapter applies it to a per-route
// lease (package adapter): zero and a fitting lease pass, others fail with
// ErrInvalidLease naming the adapter's option.
func TestLeaseRule_Adapter(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithOperationRetention("POST /short", time.Minute))
	for _, lease := range []time.Duration{0, 100 * time.Millisecond, time.Minute} {
		if err := e.c.Driver().CheckLease("WithRouteLease", "POST /short", lease); err != nil {
			t.Errorf("CheckLease(%v) = %v, want nil", lease, err)
		}
	}
	for _, lease := range []time.Duration{-1, time.Millisecond, 2 * time.Minute} {
		err := e.c.Driver().CheckLease("WithRouteLease", "POST /short", lease)
		wantInvalidLease(t, "CheckLease "+lease.String(), err)
		if err != nil && !strings.Contains(err.Error(), "WithRouteLease") {
			t.Errorf("CheckLease(%v) = %q, does not name the option", lease, err)
		}
	}
}

// TestClaimer_InvalidArgumentPrefixedOnce: an invalid fingerprint matches
// ErrInvalidScope and durable.ErrInvalidScope, with the package's prefix
// once (not the sentinel's message and the cause's, both prefixed).
func TestClaimer_InvalidArgumentPrefixedOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed)
	_, err := e.c.Claim(t.Context(), req("k", ""))
	if !errors.Is(err, claim.ErrInvalidScope) || !errors.Is(err, durable.ErrInvalidScope) {
		t.Fatalf("Claim with no fingerprint = %v, want ErrInvalidScope", err)
	}
	if got, want := err.Error(), "claim: durable: invalid fingerprint: empty or longer than 256 bytes"; got != want {
		t.Fatalf("message = %q, want %q", got, want)
	}
}
