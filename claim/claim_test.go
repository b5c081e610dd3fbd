package claim_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/txmark"
	"github.com/oncekey/oncekey/internal/fastpath"
)

func TestClaimer_Outcomes(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode)
			c := e.c

			t.Run("FirstClaimAcquiresAndRetryReplaysTheResult", func(t *testing.T) {
				r := req("k-complete", "v1:a")
				out := mustClaim(t, c, r, claim.Acquired)
				if out.OperationID == "" || out.OperationID != out.Lease.OperationID() {
					t.Fatalf("operation id %q vs lease %q", out.OperationID, out.Lease.OperationID())
				}
				if out.Lease.Token().Generation < 1 {
					t.Fatalf("generation %d", out.Lease.Token().Generation)
				}
				if err := out.Lease.Complete(t.Context(), result(`{"id":1}`)); err != nil {
					t.Fatal(err)
				}
				for i := range 2 {
					rep := mustClaim(t, c, r, claim.Replayed)
					if rep.State != durable.Completed || !bytes.Equal(rep.Result.Body, []byte(`{"id":1}`)) || rep.Result.StatusCode != 201 ||
						rep.Result.Headers["Content-Type"][0] != "application/json" || rep.Result.Version != 1 {
						t.Fatalf("replay %d = %+v", i, rep.Result)
					}
					if rep.OperationID != out.OperationID {
						t.Fatal("operation id changed across retries")
					}
					if want := mode == withRedis; rep.FromCache != want {
						t.Fatalf("replay %d FromCache = %v, want %v", i, rep.FromCache, want)
					}
				}
			})

			t.Run("DuplicateWhileProcessingIsInProgress", func(t *testing.T) {
				r := req("k-busy", "v1:a")
				mustClaim(t, c, r, claim.Acquired)
				dup := mustClaim(t, c, r, claim.InProgress)
				if dup.RetryAfter < time.Second {
					t.Fatalf("RetryAfter = %v", dup.RetryAfter)
				}
			})

			t.Run("DifferentPayloadIsMismatchWhileProcessingAndAfter", func(t *testing.T) {
				r := req("k-mismatch", "v1:a")
				out := mustClaim(t, c, r, claim.Acquired)
				other := req("k-mismatch", "v1:b")
				if _, err := c.Claim(t.Context(), other); !errors.Is(err, claim.ErrMismatch) || !errors.Is(err, durable.ErrMismatch) {
					t.Fatalf("while processing: err = %v, want ErrMismatch", err)
				}
				if err := out.Lease.Complete(t.Context(), result("done")); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if _, err := c.Claim(t.Context(), other); !errors.Is(err, claim.ErrMismatch) {
						t.Fatalf("after completion: err = %v, want ErrMismatch", err)
					}
				}
			})

			t.Run("FailedResultIsReplayed", func(t *testing.T) {
				r := req("k-fail", "v1:a")
				out := mustClaim(t, c, r, claim.Acquired)
				rej := durable.Result{StatusCode: 402, Body: []byte("declined")}
				if err := out.Lease.Fail(t.Context(), rej); err != nil {
					t.Fatal(err)
				}
				rep := mustClaim(t, c, r, claim.Replayed)
				if rep.State != durable.Failed || rep.Result.StatusCode != 402 || string(rep.Result.Body) != "declined" {
					t.Fatalf("replay = %v %+v", rep.State, rep.Result)
				}
			})

			t.Run("UncertainIsReportedAndNotReExecuted", func(t *testing.T) {
				r := req("k-uncertain", "v1:a")
				out := mustClaim(t, c, r, claim.Acquired)
				if err := out.Lease.MarkUncertain(t.Context()); err != nil {
					t.Fatal(err)
				}
				mustClaim(t, c, r, claim.Uncertain)
				if err := out.Lease.Complete(t.Context(), result("late")); err != nil {
					// The owner still holds the generation of an uncertain
					// record: completing it is the owner learning the truth.
					t.Fatalf("owner completing its uncertain record: %v", err)
				}
				mustClaim(t, c, r, claim.Replayed)
			})

			t.Run("ReleaseFreesTheKeyForAnyRequest", func(t *testing.T) {
				r := req("k-release", "v1:a")
				out := mustClaim(t, c, r, claim.Acquired)
				if err := out.Lease.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
				again := mustClaim(t, c, req("k-release", "v1:other"), claim.Acquired)
				if again.Lease.Token().Generation <= out.Lease.Token().Generation {
					t.Fatalf("generation after release %v, before %v", again.Lease.Token(), out.Lease.Token())
				}
				if err := out.Lease.Complete(t.Context(), result("stale")); !errors.Is(err, claim.ErrFenced) {
					t.Fatalf("released owner Complete = %v, want ErrFenced", err)
				}
			})

			t.Run("InvalidScopeReservesNothing", func(t *testing.T) {
				count := func() int64 {
					st, err := e.store.Stats(t.Context())
					if err != nil {
						t.Fatal(err)
					}
					n := st.Released
					for _, v := range st.ByState {
						n += v
					}
					return n
				}
				before := count()
				for _, r := range []claim.Request{
					{Scope: durable.Scope{Tenant: "", Operation: "op", Key: "k"}, Fingerprint: "v1:a"},
					{Scope: durable.Scope{Tenant: "t", Operation: "", Key: "k"}, Fingerprint: "v1:a"},
					{Scope: durable.Scope{Tenant: "t", Operation: "op", Key: ""}, Fingerprint: "v1:a"},
					{Scope: durable.Scope{Tenant: "t", Operation: "op", Key: "bad\nkey"}, Fingerprint: "v1:a"},
					{Scope: durable.Scope{Tenant: "t", Operation: "op", Key: string(bytes.Repeat([]byte("k"), 256))}, Fingerprint: "v1:a"},
					{Scope: durable.Scope{Tenant: "t", Operation: "op", Key: "k"}, Fingerprint: ""},
				} {
					if _, err := c.Claim(t.Context(), r); !errors.Is(err, claim.ErrInvalidScope) {
						t.Fatalf("Claim(%+v) err = %v, want ErrInvalidScope", r.Scope, err)
					}
					if _, err := c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
						t.Fatal("Do ran fn for an invalid request")
						return durable.Result{}, nil
					}); !errors.Is(err, claim.ErrInvalidScope) {
						t.Fatalf("Do(%+v) err = %v, want ErrInvalidScope", r.Scope, err)
					}
				}
				if after := count(); after != before {
					t.Fatalf("invalid requests wrote records: %d before, %d after", before, after)
				}
			})
		})
	}
}

func TestClaimer_StoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{withRedis, withoutRed} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode)
			c := e.newClaimer(e.downStore())
			ran := false
			r := req("k-down", "v1:a")
			if _, err := c.Claim(t.Context(), r); !errors.Is(err, claim.ErrUnavailable) {
				t.Fatalf("Claim err = %v, want ErrUnavailable", err)
			}
			_, err := c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
				ran = true
				return result("x"), nil
			})
			if !errors.Is(err, claim.ErrUnavailable) || ran {
				t.Fatalf("Do err = %v ran = %v, want ErrUnavailable and no run", err, ran)
			}
			// Redis kept no lease for the failed claim: once the store is
			// back, the same request is acquired at once.
			mustClaim(t, e.c, r, claim.Acquired)
		})
	}
}

func TestClaimer_RedisLosesData(t *testing.T) {
	t.Parallel()

	t.Run("FlushedBetweenClaimAndCompletion", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withRedis)
		r := req("k-flush", "v1:a")
		out := mustClaim(t, e.c, r, claim.Acquired)
		e.flushRedis()
		// Redis forgot the lease: a duplicate reaches the database, which
		// still says in progress.
		mustClaim(t, e.c, r, claim.InProgress)
		if err := out.Lease.Complete(t.Context(), result("ok")); err != nil {
			t.Fatal(err)
		}
		rep := mustClaim(t, e.c, r, claim.Replayed)
		if string(rep.Result.Body) != "ok" {
			t.Fatalf("body %q", rep.Result.Body)
		}
	})

	t.Run("GenerationBehindDatabaseIsSynced", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withRedis)
		r := req("k-gen", "v1:a")
		var last uint64
		for i := range 3 {
			out := mustClaim(t, e.c, r, claim.Acquired)
			if g := out.Lease.Token().Generation; g <= last {
				t.Fatalf("round %d: generation %d after %d", i, g, last)
			}
			last = out.Lease.Token().Generation
			if err := out.Lease.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			e.flushRedis() // Redis restarts empty: it will propose 1 again
		}
		// Redis proposes 1 again, which the database already used: the
		// generation is the database's, above every earlier one (how far
		// above is the store's business: it may start from a clock floor).
		out := mustClaim(t, e.c, r, claim.Acquired)
		g := out.Lease.Token().Generation
		if g <= last {
			t.Fatalf("generation %d, want above %d (the database's, not Redis's)", g, last)
		}
		st, err := fastpath.ReadStored(t.Context(), e.rdb, fastpath.KeysFor(e.prefix, e.ref(r)))
		if err != nil || st.Kind != fastpath.StoredLease || st.Generation != g || st.Owner != out.Lease.Token().Owner.String() {
			t.Fatalf("redis holds %+v, %v; want this owner's lease synced to generation %d", st, err, g)
		}
	})

	t.Run("ResultCacheMissingReplaysFromDatabaseAndRefills", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withRedis)
		r := req("k-cache", "v1:a")
		out := mustClaim(t, e.c, r, claim.Acquired)
		if err := out.Lease.Complete(t.Context(), result("stored")); err != nil {
			t.Fatal(err)
		}
		e.flushRedis()
		rep := mustClaim(t, e.c, r, claim.Replayed)
		if rep.FromCache || string(rep.Result.Body) != "stored" {
			t.Fatalf("first replay after flush: FromCache=%v body=%q", rep.FromCache, rep.Result.Body)
		}
		rep = mustClaim(t, e.c, r, claim.Replayed)
		if !rep.FromCache || string(rep.Result.Body) != "stored" {
			t.Fatalf("second replay: FromCache=%v body=%q (cache not refilled)", rep.FromCache, rep.Result.Body)
		}
	})
}

func TestClaimer_ConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis)
	r := req("k-storm", "v1:a")
	var executions atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	outcomes := make([]claim.Kind, 100)
	for i := range outcomes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out, err := e.c.Claim(context.Background(), r)
			if err != nil {
				t.Errorf("Claim: %v", err)
				return
			}
			outcomes[i] = out.Kind
			if out.Kind == claim.Acquired {
				executions.Add(1)
				if err := out.Lease.Complete(context.Background(), result("once")); err != nil {
					t.Errorf("Complete: %v", err)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := executions.Load(); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
	// One logical operation: the winner's durable claim and completion.
	// Every duplicate was answered by Redis, but those that met the
	// winner's lease while it was still tentative (before the store
	// granted it), which read the record: concurrent duplicates share one
	// read, so a few reads serve the whole burst.
	// (A read sent before a duplicate asked cannot answer it, so reads
	// follow one another while the lease is tentative: a handful under
	// the race detector on a loaded machine; one per duplicate without
	// the sharing.)
	if n := e.stmts.Count(); n > 14 {
		t.Fatalf("durable statements = %d for one logical operation and 99 duplicates, want at most 2 and 12 shared reads", n)
	}
	for i, k := range outcomes {
		if k != claim.Acquired && k != claim.InProgress && k != claim.Replayed {
			t.Fatalf("outcome %d = %v", i, k)
		}
	}
}

func TestLease_StaleOwnerIsFenced(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{withRedis, withoutRed} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode)
			r := req("k-stale", "v1:a")
			old := mustClaim(t, e.c, r, claim.Acquired)
			e.expireLease(r) // the owner paused past its lease
			cur := mustClaim(t, e.c, r, claim.Acquired)
			if cur.Lease.Token().Generation <= old.Lease.Token().Generation {
				t.Fatalf("takeover generation %v not newer than %v", cur.Lease.Token(), old.Lease.Token())
			}
			if err := old.Lease.Complete(t.Context(), result("stale")); !errors.Is(err, claim.ErrFenced) {
				t.Fatalf("stale Complete = %v, want ErrFenced", err)
			}
			if err := old.Lease.Renew(t.Context()); !errors.Is(err, claim.ErrFenced) {
				t.Fatalf("stale Renew = %v, want ErrFenced", err)
			}
			if err := cur.Lease.Complete(t.Context(), result("fresh")); err != nil {
				t.Fatal(err)
			}
			rep := mustClaim(t, e.c, r, claim.Replayed)
			if string(rep.Result.Body) != "fresh" {
				t.Fatalf("replayed %q, want the new owner's result", rep.Result.Body)
			}
			rec, err := e.store.Get(t.Context(), e.ref(r))
			if err != nil || rec.Takeovers != 1 || rec.Token != cur.Lease.Token() {
				t.Fatalf("record %+v, %v", rec, err)
			}
		})
	}
}

func TestLease_KeepAlive(t *testing.T) {
	t.Parallel()

	t.Run("RenewsWhileWorkRuns", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withRedis, claim.WithLease(600*time.Millisecond))
		r := req("k-keep", "v1:a")
		out := mustClaim(t, e.c, r, claim.Acquired)
		work, stop := out.Lease.KeepAlive(t.Context())
		// Work for over two lease lengths; the lease must hold throughout.
		for range 6 {
			time.Sleep(250 * time.Millisecond)
			mustClaim(t, e.c, r, claim.InProgress)
		}
		if err := stop(); err != nil || work.Err() == nil {
			t.Fatalf("stop = %v, work.Err = %v", err, work.Err())
		}
		if err := out.Lease.Complete(t.Context(), result("kept")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("CancelsWorkWhenTheFenceIsLost", func(t *testing.T) {
		t.Parallel()
		// 3s: the next renewal (a second away) finds the fence lost; a
		// 300ms lease let a loaded machine end the work at the lease's
		// margin first, with another cause.
		e := setup(t, withoutRed, claim.WithLease(3*time.Second))
		r := req("k-lost", "v1:a")
		out := mustClaim(t, e.c, r, claim.Acquired)
		work, stop := out.Lease.KeepAlive(t.Context())
		e.expireLease(r)
		mustClaim(t, e.c, r, claim.Acquired) // another worker takes over
		select {
		case <-work.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("work context not cancelled after the fence was lost")
		}
		if cause := context.Cause(work); !errors.Is(cause, claim.ErrFenced) {
			t.Fatalf("cause = %v, want ErrFenced", cause)
		}
		if err := stop(); !errors.Is(err, claim.ErrFenced) {
			t.Fatalf("stop = %v, want ErrFenced", err)
		}
	})
}

func TestNew_RejectsBadOptions(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed)
	for name, opt := range map[string]claim.Option{
		"lease":     claim.WithLease(-time.Second),
		"retention": claim.WithRetention(-time.Second),
		"wait":      claim.WithWait(0),
		"margin":    claim.WithStartMargin(time.Hour),
		"logger":    claim.WithLogger(nil),
		// A record must outlive the lease of its first claim.
		"retention shorter than the lease":           claim.WithRetention(time.Second),
		"operation retention shorter than the lease": claim.WithOperationRetention("POST /orders", time.Second),
	} {
		if _, err := claim.New[pgx.Tx](e.store, opt); !errors.Is(err, claim.ErrConfig) {
			t.Errorf("%s: New = %v, want an error matching ErrConfig", name, err)
		}
	}
	if _, err := claim.New[pgx.Tx](e.store, claim.WithLease(time.Second), claim.WithRetention(time.Second),
		claim.WithOperationRetention("POST /orders", time.Second)); err != nil {
		t.Errorf("New rejected a retention equal to the lease: %v", err)
	}
	if _, err := claim.New[pgx.Tx](nil); !errors.Is(err, claim.ErrConfig) {
		t.Errorf("New with a nil store = %v, want ErrConfig", err)
	}
	// A durable.Store without the claim protocol (only the stores of this
	// module have it) is a configuration error, not a panic.
	if _, err := claim.New[pgx.Tx](readOnlyStore{s: e.store}); !errors.Is(err, claim.ErrConfig) ||
		!strings.Contains(err.Error(), "does not implement the oncekey protocol") {
		t.Errorf("New with a store without the protocol = %v, want ErrConfig", err)
	}
}

// readOnlyStore is a durable.Store and nothing more.
type readOnlyStore struct {
	txmark.Mark[pgx.Tx]
	s durable.Store[pgx.Tx]
}

func (r readOnlyStore) Ref(sc durable.Scope) (durable.Ref, error) { return r.s.Ref(sc) }
func (r readOnlyStore) Get(ctx context.Context, ref durable.Ref) (durable.Record, error) {
	return r.s.Get(ctx, ref)
}
func (r readOnlyStore) Sweep(ctx context.Context, batch int) (int, error) {
	return r.s.Sweep(ctx, batch)
}
func (r readOnlyStore) Stats(ctx context.Context) (durable.Stats, error) { return r.s.Stats(ctx) }

func TestClaimer_WaitPolicyReplaysWhenFirstFinishes(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis, claim.WithWait(5*time.Second))
	r := req("k-wait", "v1:a")
	out := mustClaim(t, e.c, r, claim.Acquired)
	done := make(chan claim.Outcome, 1)
	go func() {
		o, err := e.c.Claim(context.Background(), r)
		if err != nil {
			t.Errorf("waiting Claim: %v", err)
		}
		done <- o
	}()
	time.Sleep(50 * time.Millisecond)
	if err := out.Lease.Complete(t.Context(), result("waited")); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.Kind != claim.Replayed || string(o.Result.Body) != "waited" {
		t.Fatalf("waiting duplicate got %v %+v", o.Kind, o.Result)
	}
}

func TestClaimer_StartMargin(t *testing.T) {
	t.Parallel()

	t.Run("ScalesWithTheRequestLease", func(t *testing.T) {
		t.Parallel()
		// The Claimer's lease is the default 30s; its default margin (3s)
		// must not apply to a claim made with a 2s lease.
		e := setup(t, withoutRed)
		e.orders()
		r := req("m-short", "v1:a")
		r.Lease = 2 * time.Second
		out, err := e.c.Claim(t.Context(), r)
		if err != nil || out.Kind != claim.Acquired {
			t.Fatalf("Claim with a 2s lease = %v, %v; want Acquired", out.Kind, err)
		}
		if rem := time.Until(out.Lease.Deadline()); rem > r.Lease {
			t.Fatalf("Remaining = %v, more than the request's lease %v", rem, r.Lease)
		}
		if err := out.Lease.Complete(t.Context(), result("short")); err != nil {
			t.Fatal(err)
		}
		d := req("m-short-do", "v1:a")
		d.Lease = 2 * time.Second
		if out, err := e.c.Do(t.Context(), d, e.insertOrder); err != nil || out.Kind != claim.Executed {
			t.Fatalf("Do with a 2s lease = %v, %v; want Executed", out.Kind, err)
		}
	})

	t.Run("ExplicitMarginNotShorterThanTheRequestLeaseReservesNothing", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withoutRed, claim.WithStartMargin(5*time.Second))
		r := req("m-explicit", "v1:a")
		r.Lease = 2 * time.Second
		if _, err := e.c.Claim(t.Context(), r); err == nil || errors.Is(err, claim.ErrLeaseExpired) || errors.Is(err, claim.ErrUnavailable) {
			t.Fatalf("Claim err = %v, want a configuration error", err)
		}
		if _, err := e.c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
			t.Error("Do ran fn under a lease shorter than the start margin")
			return durable.Result{}, nil
		}); err == nil || errors.Is(err, claim.ErrLeaseExpired) {
			t.Fatalf("Do err = %v, want a configuration error", err)
		}
		if _, err := e.store.Get(t.Context(), e.ref(r)); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("record after rejected claims: %v, want ErrNotFound (nothing reserved)", err)
		}
	})

	t.Run("RequestLeaseLongerThanTheRetentionReservesNothing", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withoutRed, claim.WithLease(time.Second), claim.WithRetention(time.Minute))
		r := req("m-retention", "v1:a")
		r.Lease = 2 * time.Minute
		if _, err := e.c.Claim(t.Context(), r); err == nil {
			t.Fatal("Claim accepted a lease longer than the retention")
		}
		if _, err := e.store.Get(t.Context(), e.ref(r)); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("record after a rejected claim: %v, want ErrNotFound (nothing reserved)", err)
		}
	})
}
