package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/fence"
)

// TestNotMigrated: every operation of a store whose table was never
// migrated answers ErrNotMigrated, which says what to run, keeps the
// server's error visible, and is neither ErrUnavailable (retrying does not
// help) nor a raw driver error.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]fixtureOpts{
		"SearchPath": {noMigrate: true},
		"WithSchema": {noMigrate: true, qualified: true},
		"WithTable":  {noMigrate: true, opts: []postgres.Option{postgres.WithTable("never_migrated")}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, o)
			ctx := t.Context()
			sc := durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "k"}
			ref, err := f.s.Ref(sc)
			if err != nil {
				t.Fatal(err)
			}
			p := storeapi.ClaimParams{Scope: sc, Fingerprint: "v1:fp", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour}
			tok := fence.Token{Generation: 1, Owner: p.Owner}
			ops := map[string]func() error{
				"Claim": func() error { _, err := f.s.Claim(ctx, nil, p); return err },
				"ClaimInTx": func() error {
					return f.s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
						_, err := f.s.Claim(ctx, tx, p)
						return err
					})
				},
				"Get":       func() error { _, err := f.s.Get(ctx, ref); return err },
				"Operation": func() error { _, err := f.s.Operation(ctx, "acme", ref.Digest()); return err },
				"Complete":  func() error { return f.s.Complete(ctx, nil, ref, tok, durable.Result{StatusCode: 200}) },
				"Renew":     func() error { return f.s.Renew(ctx, ref, tok, time.Minute) },
				"Sweep":     func() error { _, err := f.s.Sweep(ctx, 10); return err },
				"Pending":   func() error { _, err := f.s.Pending(ctx, 0, 10); return err },
				"Stats":     func() error { _, err := f.s.Stats(ctx); return err },
			}
			for op, call := range ops {
				err := call()
				var pgErr *pgconn.PgError
				switch {
				case !errors.Is(err, postgres.ErrNotMigrated):
					t.Errorf("%s = %v, want ErrNotMigrated", op, err)
				case errors.Is(err, durable.ErrUnavailable):
					t.Errorf("%s = %v, also ErrUnavailable", op, err)
				case !strings.Contains(err.Error(), "oncekey migrate up") || !strings.Contains(err.Error(), "postgres.Migrate"):
					t.Errorf("%s = %q, does not say what to run", op, err)
				case !errors.As(err, &pgErr) || pgErr.Code != "42P01":
					t.Errorf("%s = %v, the server's error (42P01) is not visible", op, err)
				}
			}
		})
	}
	// The negative control: once migrated, the same store claims.
	f := newFixture(t, fixtureOpts{noMigrate: true})
	if err := postgres.Migrate(t.Context(), f.pool, f.opts...); err != nil {
		t.Fatal(err)
	}
	p := storeapi.ClaimParams{Scope: durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "k"}, Fingerprint: "v1:fp",
		Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour}
	if res, err := f.s.Claim(t.Context(), nil, p); err != nil || !res.Acquired {
		t.Fatalf("Claim after Migrate = %+v, %v", res, err)
	}
}

// sessionSettings is the method a claim.Claimer reads the store's settings
// through.
type sessionSettings interface {
	SessionSettings(ctx context.Context) (durability, timeouts string, err error)
}

// TestSessionSettings_Timeouts: a pool not configured with ConfigurePool
// (its sessions have no lock_timeout nor idle_in_transaction_session_timeout)
// is reported with both names and what to call; a configured one is not;
// durability is reported beside it.
func TestSessionSettings_Timeouts(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		o            fixtureOpts
		wantTimeouts bool
	}{
		"Unconfigured":  {fixtureOpts{unconfigured: true}, true},
		"ConfigurePool": {fixtureOpts{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, tc.o)
			dur, timeouts, err := f.s.(sessionSettings).SessionSettings(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if dur != "" {
				t.Errorf("durability = %q on the default server, want empty", dur)
			}
			if (timeouts != "") != tc.wantTimeouts {
				t.Fatalf("timeouts = %q, want reported: %v", timeouts, tc.wantTimeouts)
			}
			if tc.wantTimeouts {
				for _, want := range []string{"lock_timeout", "idle_in_transaction_session_timeout", "postgres.ConfigurePool"} {
					if !strings.Contains(timeouts, want) {
						t.Errorf("timeouts = %q, lacks %q", timeouts, want)
					}
				}
			}
		})
	}
	t.Run("SynchronousCommitOff", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, fixtureOpts{})
		pool := poolWith(t, f.schema.URL, map[string]string{"synchronous_commit": "off", "lock_timeout": "5000", "idle_in_transaction_session_timeout": "15000"})
		st, err := postgres.New(pool, f.opts...)
		if err != nil {
			t.Fatal(err)
		}
		dur, timeouts, err := st.(sessionSettings).SessionSettings(t.Context())
		if err != nil || !strings.Contains(dur, "set synchronous_commit = on") || timeouts != "" {
			t.Fatalf("SessionSettings = %q, %q, %v; want synchronous_commit reported, no timeouts", dur, timeouts, err)
		}
	})
}
