package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/testkit/pgproxy"
)

// commitWriter is the fixture's store as the Claimer's Do sees it.
func commitWriter(t *testing.T, f *fixture) storeapi.CommitWriter[pgx.Tx] {
	t.Helper()
	w, ok := f.s.(storeapi.CommitWriter[pgx.Tx])
	if !ok {
		t.Fatal("the PostgreSQL store does not implement storeapi.CommitWriter")
	}
	return w
}

// businessTable creates a table for business rows in the fixture's schema.
func businessTable(t *testing.T, f *fixture) {
	t.Helper()
	if _, err := f.pool.Exec(ctxOf(t), `CREATE TABLE business (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
}

// settled checks that n business rows committed and that every connection
// went back to the pool.
func settled(t *testing.T, f *fixture, n int) {
	t.Helper()
	if got := businessRows(t, f); len(got) != n {
		t.Fatalf("business rows = %v; want %d", got, n)
	}
	// A connection closed after a lost reply is destroyed by the pool in
	// the background, and counts as acquired until then: wait for it, a
	// bounded while (a loaded CI machine saw it still counted at once).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c := f.pool.Stat().AcquiredConns()
		if c == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still acquired", c)
		}
	}
}

// commitFixture is a store on a fresh schema with a business table, as Do
// sees it.
func commitFixture(t *testing.T, o fixtureOpts) (*fixture, storeapi.CommitWriter[pgx.Tx], context.Context) {
	t.Helper()
	f := newFixture(t, o)
	businessTable(t, f)
	return f, commitWriter(t, f), ctxOf(t)
}

func businessRows(t *testing.T, f *fixture) []string {
	t.Helper()
	rows, err := f.pool.Query(ctxOf(t), `SELECT id FROM business ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// write returns an InsertAtCommit function that inserts the business row id
// and finishes with state and result.
func write(id string, state durable.State) func(context.Context, pgx.Tx) (durable.State, durable.Result, error) {
	return func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO business (id) VALUES ($1)`, id); err != nil {
			return "", durable.Result{}, err
		}
		return state, result, nil
	}
}

// freshToken is a generation at the database's clock, as the Claimer
// proposes one (the clock in milliseconds, less 30 s).
func freshToken() fence.Token {
	return fence.Token{Generation: uint64(time.Now().UnixMilli() - 30_000), Owner: uuid.New()}
}

func TestInsertAtCommit_WritesTheFinishedRecordWithTheCommit(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	for _, state := range []durable.State{durable.Completed, durable.Failed} {
		sc := scope()
		ref, _ := f.s.Ref(sc)
		p, tok := claimParams(sc, time.Second), freshToken()
		before := f.stmts.Count()
		if err := w.InsertAtCommit(ctx, p, tok, write(sc.Key, state)); err != nil {
			t.Fatalf("InsertAtCommit(%v) = %v", state, err)
		}
		// BEGIN, the business INSERT, then the record's INSERT with COMMIT.
		if n := f.stmts.Count() - before; n != 3 {
			t.Fatalf("InsertAtCommit took %d round trips; want 3", n)
		}
		rec, err := f.s.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != state || rec.Token != tok || rec.Fingerprint != p.Fingerprint || rec.Result == nil ||
			!bytes.Equal(rec.Result.Body, result.Body) || rec.Result.ResourceID != result.ResourceID ||
			rec.Result.Headers["Etag"][0] != result.Headers["Etag"][0] || rec.LeaseRemaining != 0 ||
			rec.ExpiresIn < 59*time.Minute || rec.CompletedAt.IsZero() {
			t.Fatalf("record = %+v; want %v under %v with the result and a full retention", rec, state, tok)
		}
		// Its operation identity serves polling, as a claimed record's does.
		if op, err := f.s.Operation(ctx, ref.Tenant, ref.Digest()); err != nil || op.Token != tok {
			t.Fatalf("Operation = %+v, %v; want the record", op, err)
		}
		// It replays like any finished record.
		res, err := f.s.Claim(ctx, nil, claimParams(sc, time.Second))
		if err != nil || res.Acquired || res.Record == nil || res.Record.State != state {
			t.Fatalf("Claim after InsertAtCommit = %+v, %v; want the finished record", res, err)
		}
	}
	settled(t, f, 2)
}

func TestInsertAtCommit_ExistingRecordRollsEverythingBack(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})

	// Finished, processing and released records all refuse the insert.
	finished, processing, released := scope(), scope(), scope()
	ref, _ := f.s.Ref(finished)
	tok := acquire(t, f.s, claimParams(finished, time.Hour))
	if err := f.s.Complete(ctx, nil, ref, tok, result); err != nil {
		t.Fatal(err)
	}
	acquire(t, f.s, claimParams(processing, time.Hour))
	rref, _ := f.s.Ref(released)
	if err := f.s.Release(ctx, nil, rref, acquire(t, f.s, claimParams(released, time.Hour))); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []durable.Scope{finished, processing, released} {
		ref, _ := f.s.Ref(sc)
		before, _ := f.s.Get(ctx, ref)
		err := w.InsertAtCommit(ctx, claimParams(sc, time.Second), freshToken(), write(sc.Key, durable.Completed))
		if !errors.Is(err, storeapi.ErrNotInserted) {
			t.Fatalf("InsertAtCommit over a %v record = %v; want ErrNotInserted", before.State, err)
		}
		if after, _ := f.s.Get(ctx, ref); after.Token != before.Token || after.State != before.State {
			t.Fatalf("record changed: %+v -> %+v", before, after)
		}
	}
	settled(t, f, 0)
}

func TestInsertAtCommit_GenerationBelowTheFloorIsRefused(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	sc := scope()
	ref, _ := f.s.Ref(sc)
	// 61 s behind the database's clock: below the floor (60 s), which keeps
	// generations monotonic across Sweep.
	stale := fence.Token{Generation: uint64(time.Now().UnixMilli() - 61_000), Owner: uuid.New()}
	err := w.InsertAtCommit(ctx, claimParams(sc, time.Second), stale, write(sc.Key, durable.Completed))
	if !errors.Is(err, storeapi.ErrNotInserted) {
		t.Fatalf("InsertAtCommit below the floor = %v; want ErrNotInserted", err)
	}
	if _, err := f.s.Get(ctx, ref); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("Get = %v; want no record", err)
	}
	settled(t, f, 0)
	// The same request at the clock goes through.
	if err := w.InsertAtCommit(ctx, claimParams(sc, time.Second), freshToken(), write(sc.Key, durable.Completed)); err != nil {
		t.Fatal(err)
	}
}

// Two transactions of one key: the one that commits first wins, and the
// other, whose insert waits for it, rolls back with its business write.
func TestInsertAtCommit_TheTransactionIsTheLease(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})

	t.Run("first commit wins", func(t *testing.T) {
		sc := scope()
		inFn, release := make(chan struct{}), make(chan struct{})
		slow := make(chan error, 1)
		go func() {
			slow <- w.InsertAtCommit(ctx, claimParams(sc, time.Second), freshToken(),
				func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
					st, res, err := write(sc.Key+"-slow", durable.Completed)(ctx, tx)
					close(inFn)
					<-release
					return st, res, err
				})
		}()
		<-inFn
		fast := freshToken()
		if err := w.InsertAtCommit(ctx, claimParams(sc, time.Second), fast, write(sc.Key+"-fast", durable.Completed)); err != nil {
			t.Fatalf("the duplicate that commits first = %v", err)
		}
		close(release)
		if err := <-slow; !errors.Is(err, storeapi.ErrNotInserted) {
			t.Fatalf("the slow duplicate = %v; want ErrNotInserted", err)
		}
		ref, _ := f.s.Ref(sc)
		if rec, _ := f.s.Get(ctx, ref); rec.Token != fast {
			t.Fatalf("record token %v; want the winner's %v", rec.Token, fast)
		}
	})

	// A claim holding the row in an open transaction: the insert waits for
	// it, then fails if it committed, or goes through if it rolled back.
	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "claim committed", false: "claim rolled back"}[commit]
		t.Run(name, func(t *testing.T) {
			sc := scope()
			tx, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck
			if res, err := f.s.Claim(ctx, tx, claimParams(sc, time.Hour)); err != nil || !res.Acquired {
				t.Fatalf("Claim in tx = %+v, %v", res, err)
			}
			done := make(chan error, 1)
			go func() {
				done <- w.InsertAtCommit(ctx, claimParams(sc, time.Second), freshToken(), write(sc.Key, durable.Completed))
			}()
			waitLockWaiter(t, f)
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			err = <-done
			if commit && !errors.Is(err, storeapi.ErrNotInserted) {
				t.Fatalf("insert after the claim committed = %v; want ErrNotInserted", err)
			}
			if !commit && err != nil {
				t.Fatalf("insert after the claim rolled back = %v; want success", err)
			}
		})
	}
	settled(t, f, 2)
}

func TestInsertAtCommit_FunctionErrorOrPanicRollsBack(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	sc := scope()
	ref, _ := f.s.Ref(sc)
	boom := errors.New("boom")
	err := w.InsertAtCommit(ctx, claimParams(sc, time.Second), freshToken(),
		func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
			_, _, _ = write(sc.Key, durable.Completed)(ctx, tx)
			return "", durable.Result{}, boom
		})
	if !errors.Is(err, boom) {
		t.Fatalf("InsertAtCommit = %v; want fn's error", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on")
			}
		}()
		_ = w.InsertAtCommit(ctx, claimParams(sc, time.Second), freshToken(),
			func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
				_, _, _ = write(sc.Key, durable.Completed)(ctx, tx)
				panic("fn")
			})
	}()
	if _, err := f.s.Get(ctx, ref); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("Get = %v; want no record", err)
	}
	settled(t, f, 0)
}

func TestInsertAtCommit_LostCommitReplyIsUnknown(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{proxy: true})
	sc := scope()
	ref, _ := f.s.Ref(sc)
	tok := freshToken()
	err := w.InsertAtCommit(ctx, claimParams(sc, time.Second), tok,
		func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
			st, res, err := write(sc.Key, durable.Completed)(ctx, tx)
			f.proxy.Arm(pgproxy.CutStatement) // the next statement: the INSERT with the COMMIT
			return st, res, err
		})
	if f.proxy.Cuts() != 1 {
		t.Fatalf("the proxy cut %d replies; want 1", f.proxy.Cuts())
	}
	if !errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InsertAtCommit with its reply lost = %v; want ErrUnavailable (outcome unknown)", err)
	}
	// It applied: the re-read shows it.
	if rec, err := f.s.Get(ctx, ref); err != nil || rec.Token != tok || rec.State != durable.Completed {
		t.Fatalf("Get = %+v, %v; want the committed record", rec, err)
	}
	settled(t, f, 1)
}

func TestInsertAtCommit_InvalidArgumentsWriteNothing(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	sc := scope()
	ref, _ := f.s.Ref(sc)
	ran := false
	noRun := func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
		ran = true
		return durable.Completed, result, nil
	}
	for name, c := range map[string]struct {
		p   storeapi.ClaimParams
		tok fence.Token
	}{
		"no owner":      {claimParams(sc, time.Second), fence.Token{Generation: freshToken().Generation}},
		"no generation": {claimParams(sc, time.Second), fence.Token{Owner: uuid.New()}},
		"bad scope":     {claimParams(durable.Scope{Operation: "x"}, time.Second), freshToken()},
	} {
		if err := w.InsertAtCommit(ctx, c.p, c.tok, noRun); !errors.Is(err, durable.ErrInvalidScope) {
			t.Errorf("%s: InsertAtCommit = %v; want ErrInvalidScope", name, err)
		}
	}
	if ran {
		t.Fatal("fn ran for invalid arguments")
	}
	// A state that is not final, or a result out of range, after fn ran:
	// rolled back.
	for name, fn := range map[string]func(context.Context, pgx.Tx) (durable.State, durable.Result, error){
		"processing": func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
			st, res, err := write(sc.Key, durable.Completed)(ctx, tx)
			_ = st
			return durable.Processing, res, err
		},
		"status out of range": func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
			st, _, err := write(sc.Key, durable.Completed)(ctx, tx)
			return st, durable.Result{StatusCode: 1 << 40}, err
		},
	} {
		if err := w.InsertAtCommit(ctx, claimParams(sc, time.Second), freshToken(), fn); !errors.Is(err, durable.ErrInvalidScope) {
			t.Errorf("%s: InsertAtCommit = %v; want ErrInvalidScope", name, err)
		}
	}
	if _, err := f.s.Get(ctx, ref); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("Get = %v; want no record", err)
	}
	settled(t, f, 0)
}
