package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/redisproc"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// oncekey runs the command as main would, with stdin, and returns its exit
// status and outputs.
func oncekey(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	var code int
	if stdin == "" {
		code = run(args, &out, &errb)
	} else {
		code = runCtx(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	}
	return code, out.String(), errb.String()
}

func want(t *testing.T, what string, code, wantCode int, stdout, stderr string) {
	t.Helper()
	if code != wantCode {
		t.Fatalf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", what, code, wantCode, stdout, stderr)
	}
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return p
}

// db is a fresh schema, migrated by the command, and the library's store on it.
type testDB struct {
	url, schema string
	store       storeapi.Store[pgx.Tx]
	args        []string // -database-url and -schema
}

func newDB(t *testing.T, secret []byte) testDB {
	t.Helper()
	s := testenv.Postgres(t)
	d := testDB{url: testenv.DatabaseURL(t), schema: s.Name}
	d.args = []string{"-database-url", d.url, "-schema", d.schema}
	code, out, errs := oncekey(t, "", append([]string{"migrate"}, append(d.args, "up")...)...)
	want(t, "migrate up", code, 0, out, errs)
	opts := []postgres.Option{postgres.WithSchema(s.Name)}
	if secret != nil {
		opts = append(opts, postgres.WithKeySecret(secret))
	}
	st, err := postgres.New(s.Pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	d.store = st.(storeapi.Store[pgx.Tx])
	return d
}

func (d testDB) cmd(name string, extra ...string) []string {
	return append(append([]string{name}, d.args...), extra...)
}

func claimScope(t *testing.T, st storeapi.Store[pgx.Tx], sc durable.Scope, retention time.Duration) storeapi.ClaimResult {
	t.Helper()
	res, err := st.Claim(context.Background(), nil, storeapi.ClaimParams{
		Scope: sc, Fingerprint: "fp", Owner: uuid.New(), Lease: time.Minute, Retention: retention,
	})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %+v %v", res, err)
	}
	return res
}

func TestHelpListsEverySubcommand(t *testing.T) {
	code, out, errs := oncekey(t, "", "-h")
	want(t, "oncekey -h", code, 0, out, errs)
	for _, c := range []string{"migrate", "stats", "inspect", "pending", "resolve", "sweep", "redis"} {
		if !strings.Contains(out, "\n  "+c+" ") {
			t.Errorf("oncekey -h does not list %s:\n%s", c, out)
		}
		code, out, errs := oncekey(t, "", c, "-h")
		want(t, c+" -h", code, 0, out, errs)
		if !strings.Contains(out, "Usage: oncekey "+c) || !strings.Contains(out, "-") {
			t.Errorf("%s -h prints no usage:\n%s", c, out)
		}
	}
	code, out, errs = oncekey(t, "", "redis", "check", "-h")
	want(t, "redis check -h", code, 0, out, errs)
	code, _, errs = oncekey(t, "", "frobnicate")
	want(t, "unknown command", code, 2, "", errs)
	if !strings.Contains(errs, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: stderr %q", errs)
	}
	code, _, errs = oncekey(t, "")
	want(t, "no command", code, 2, "", errs)
}

func TestBadInputIsUsageError(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	db := "postgres://postgres@127.0.0.1:1/test"
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"stats"}, "no database: set -database-url or DATABASE_URL"},
		{[]string{"stats", "-database-url", "::bad"}, "-database-url: cannot be parsed"},
		{[]string{"stats", "-database-url", db, "-table", "Bad-Name"}, "invalid configuration"},
		{[]string{"stats", "-nope"}, "flag provided but not defined: -nope"},
		{[]string{"stats", "-database-url", db, "extra"}, `unexpected argument "extra"`},
		{[]string{"migrate", "-database-url", db}, "want exactly one of up, status, contract, down"},
		{[]string{"migrate", "-database-url", db, "sideways"}, `unknown action "sideways"`},
		{[]string{"migrate", "-database-url", db, "down"}, "add -yes to confirm"},
		{[]string{"inspect", "-database-url", db}, "-tenant is required"},
		{[]string{"inspect", "-database-url", db, "-tenant", "t"}, "give -operation and -key"},
		{[]string{"inspect", "-database-url", db, "-tenant", "t", "-id", "op_x"}, "-id must be an operation id"},
		{[]string{"inspect", "-database-url", db, "-tenant", "t", "-id", "op_" + strings.Repeat("*", 43)}, "-id must be an operation id"},
		{[]string{"inspect", "-database-url", db, "-tenant", "t", "-operation", "o", "-key", "bad\x01key"}, "durable: invalid key"},
		{[]string{"inspect", "-database-url", db, "-tenant", "t", "-operation", "o", "-key", "k", "-id", "op_" + strings.Repeat("a", 43)}, "not both"},
		{[]string{"resolve", "-database-url", db, "-tenant", "t", "-operation", "o", "-key", "k", "-format", "http", "-as", "released", "-status", "200", "-reason", "r"}, "-as must be completed or failed"},
		{[]string{"resolve", "-database-url", db, "-tenant", "t", "-operation", "o", "-key", "k", "-format", "http", "-as", "completed", "-status", "42", "-reason", "r"}, "status 42 is not a final HTTP status"},
		{[]string{"resolve", "-database-url", db, "-tenant", "t", "-operation", "o", "-key", "k", "-format", "http", "-as", "completed", "-status", "200"}, "-reason is required"},
		{[]string{"pending", "-database-url", db, "-limit", "0"}, "-limit must be 1 to 10000"},
		{[]string{"sweep", "-database-url", db, "-batch", "0"}, "-batch must be 1 to 100000"},
		{[]string{"redis"}, "want: oncekey redis check"},
		{[]string{"redis", "check"}, "no Redis: set -redis-url or REDIS_URL"},
		{[]string{"redis", "check", "-redis-url", "http://x"}, "-redis-url: the scheme must be redis://, rediss:// or unix://"},
		{[]string{"redis", "check", "-redis-url", "redis://127.0.0.1:1", "-pings", "0"}, "-pings must be 1 to 1000"},
	} {
		code, out, errs := oncekey(t, "", tc.args...)
		want(t, strings.Join(tc.args, " "), code, 2, out, errs)
		if !strings.Contains(errs, tc.msg) {
			t.Errorf("%q: stderr %q does not say %q", tc.args, errs, tc.msg)
		}
	}
}

func TestUnreachableServicesFail(t *testing.T) {
	port := closedPort(t)
	db := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?connect_timeout=5", port)
	for _, args := range [][]string{
		{"migrate", "-database-url", db, "up"},
		{"migrate", "-database-url", db, "status"},
		{"stats", "-database-url", db},
		{"pending", "-database-url", db},
		{"sweep", "-database-url", db},
		{"inspect", "-database-url", db, "-tenant", "t", "-operation", "o", "-key", "k"},
		{"resolve", "-database-url", db, "-tenant", "t", "-operation", "o", "-key", "k", "-format", "http", "-as", "failed", "-status", "402", "-reason", "r", "-operator", "ana"},
	} {
		code, out, errs := oncekey(t, "", args...)
		want(t, strings.Join(args, " "), code, 1, out, errs)
		if !strings.Contains(errs, fmt.Sprintf("database unreachable (127.0.0.1:%d)", port)) {
			t.Errorf("%q: stderr %q does not say the database is unreachable", args, errs)
		}
	}
	// DATABASE_URL is used when no flag is given.
	t.Setenv("DATABASE_URL", db)
	code, out, errs := oncekey(t, "", "stats")
	want(t, "stats with DATABASE_URL", code, 1, out, errs)
	if !strings.Contains(errs, "database unreachable") {
		t.Errorf("stats with DATABASE_URL: %q", errs)
	}
	t.Setenv("REDIS_URL", fmt.Sprintf("redis://127.0.0.1:%d", port))
	code, out, errs = oncekey(t, "", "redis", "check", "-timeout", "5s")
	want(t, "redis check, closed port", code, 1, out, errs)
	if !strings.Contains(errs, fmt.Sprintf("redis unreachable (127.0.0.1:%d)", port)) || strings.Contains(errs, "pool.go") {
		t.Errorf("redis check, closed port: stderr %q", errs)
	}
}

func TestRedisCheck(t *testing.T) {
	testenv.Redis(t) // skips or fails (CI) without a server
	code, out, errs := oncekey(t, "", "redis", "check", "-redis-url", testenv.RedisURL(t), "-pings", "3")
	want(t, "redis check", code, 0, out, errs)
	for _, s := range []string{"version", "maxmemory-policy  noeviction", "over 3 PINGs", "not in cluster mode"} {
		if !strings.Contains(out, s) {
			t.Errorf("redis check output lacks %q:\n%s", s, out)
		}
	}
	// Negative control: a server that may evict keys fails the check.
	srv := redisproc.Start(t, redisproc.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	code, out, errs = oncekey(t, "", "redis", "check", "-redis-url", "redis://"+srv.Addr())
	want(t, "redis check, allkeys-lru", code, 1, out, errs)
	if !strings.Contains(out, "allkeys-lru") || !strings.Contains(errs, "check failed: maxmemory-policy") {
		t.Errorf("allkeys-lru not reported:\n%s\n%s", out, errs)
	}
}

func TestRedisCheckCluster(t *testing.T) {
	addrs := redisproc.Cluster(t, 3)
	code, out, errs := oncekey(t, "", "redis", "check", "-redis-url", "redis://"+addrs[0])
	want(t, "redis check, cluster", code, 0, out, errs)
	if !strings.Contains(out, "16384/16384 ok, state ok") {
		t.Errorf("cluster slots not reported:\n%s", out)
	}
	// Negative control: a cluster node alone, no slots assigned.
	srv := redisproc.Start(t, redisproc.Options{Cluster: true})
	code, out, errs = oncekey(t, "", "redis", "check", "-redis-url", "redis://"+srv.Addr())
	want(t, "redis check, unassigned cluster", code, 1, out, errs)
	if !strings.Contains(errs, "cluster slots") {
		t.Errorf("missing slots not reported:\n%s\n%s", out, errs)
	}
}

// migrateOn returns a fresh schema and a function that runs oncekey
// migrate on it, with flags, then the words of action.
func migrateOn(t *testing.T, flags ...string) (testenv.Schema, func(action ...string) (int, string, string)) {
	t.Helper()
	s := testenv.Postgres(t)
	args := append([]string{"-database-url", testenv.DatabaseURL(t), "-schema", s.Name}, flags...)
	return s, func(action ...string) (int, string, string) {
		return oncekey(t, "", append(append([]string{"migrate"}, args...), action...)...)
	}
}

func TestMigrate(t *testing.T) {
	s, mig := migrateOn(t, "-table", "idem")
	ms, err := pgmigrate.List(postgres.Migrations())
	if err != nil || len(ms) < 2 {
		t.Fatalf("migrations: %v %v", ms, err)
	}
	var ups, contracts []pgmigrate.Migration
	for _, m := range ms {
		if m.Contract {
			contracts = append(contracts, m)
		} else {
			ups = append(ups, m)
		}
	}
	if len(contracts) == 0 || len(ms) < 3 {
		t.Fatalf("this test wants a contract step among at least three migrations: %v", ms)
	}
	lastUp := ups[len(ups)-1]
	const contractNo = " no (contract step"
	code, out, errs := mig("status")
	want(t, "status of an empty schema", code, 0, out, errs)
	if strings.Count(out, " no\n") != len(ups) || strings.Count(out, contractNo) != len(contracts) {
		t.Fatalf("status of an empty schema:\n%s", out)
	}
	code, out, errs = mig("contract")
	want(t, "contract without -yes", code, 2, out, errs)
	// Two deploys at once: both succeed, each version recorded once.
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Go(func() { codes[i], _, _ = mig("up") })
	}
	wg.Wait()
	for i, c := range codes {
		if c != 0 {
			t.Fatalf("concurrent up %d: exit %d", i, c)
		}
	}
	recorded := func() int {
		var n int
		if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.Name+`.idem_migrations`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := recorded(); n != len(ups) {
		t.Fatalf("recorded versions: %d; want %d (up applies no contract step)", n, len(ups))
	}
	code, out, errs = mig("up")
	want(t, "up again", code, 0, out, errs)
	if !strings.Contains(out, fmt.Sprintf("up to date: version %d (%s)", lastUp.Version, lastUp.Name)) {
		t.Fatalf("up again: %s", out)
	}
	code, out, errs = mig("status")
	want(t, "status", code, 0, out, errs)
	if strings.Contains(out, " no\n") || strings.Count(out, contractNo) != len(contracts) || !strings.Contains(out, lastUp.Name) {
		t.Fatalf("status after up:\n%s", out)
	}
	for _, m := range contracts {
		code, out, errs = mig("-yes", "contract")
		want(t, "contract", code, 0, out, errs)
		if !strings.Contains(out, fmt.Sprintf("applied contract step %d", m.Version)) {
			t.Fatalf("contract: %s; want step %d", out, m.Version)
		}
	}
	code, out, errs = mig("-yes", "contract")
	want(t, "contract with none left", code, 0, out, errs)
	if !strings.Contains(out, "no contract step left") {
		t.Fatalf("contract with none left: %s", out)
	}
	if code, out, _ = mig("status"); code != 0 || strings.Contains(out, " no") || recorded() != len(ms) {
		t.Fatalf("status after contract (%d recorded):\n%s", recorded(), out)
	}
	// Two downs roll back the two highest versions, whichever kind.
	rolled := ms[len(ms)-2:]
	notApplied := 0
	for i := len(rolled) - 1; i >= 0; i-- {
		code, out, errs = mig("-yes", "down")
		want(t, "down", code, 0, out, errs)
		if !strings.Contains(out, fmt.Sprintf("rolled back version %d", rolled[i].Version)) {
			t.Fatalf("down did not roll back version %d: %s", rolled[i].Version, out)
		}
		if !rolled[i].Contract {
			notApplied++
		}
	}
	code, out, _ = mig("status")
	if code != 0 || strings.Count(out, " no\n") != notApplied {
		t.Fatalf("status after two downs (want %v not applied):\n%s", rolled, out)
	}
	for _, m := range rolled {
		if !m.Contract && !regexp.MustCompile(m.Name+` +no\n`).MatchString(out) || m.Contract && !strings.Contains(out, m.Name) {
			t.Fatalf("status after two downs: %s is not shown as not applied:\n%s", m.Name, out)
		}
	}
	// The library's Migrate (what services run) brings it back and records
	// it, and leaves the contract steps to the operator.
	if err := postgres.Migrate(context.Background(), s.Pool, postgres.WithSchema(s.Name), postgres.WithTable("idem")); err != nil {
		t.Fatal(err)
	}
	if code, out, _ = mig("status"); code != 0 || strings.Contains(out, " no\n") || strings.Count(out, contractNo) != len(contracts) {
		t.Fatalf("status after Migrate:\n%s", out)
	}
	if code, out, errs = mig("-yes", "contract"); code != 0 {
		t.Fatalf("contract again: %d %s %s", code, out, errs)
	}
	// Down to nothing, one step each, newest first; 001's drops the table.
	for i := len(ms) - 1; i >= 0; i-- {
		code, out, errs = mig("-yes", "down")
		want(t, "down "+ms[i].Name, code, 0, out, errs)
		if !strings.Contains(out, fmt.Sprintf("rolled back version %d", ms[i].Version)) {
			t.Fatalf("down: %s; want version %d", out, ms[i].Version)
		}
	}
	var exists bool
	_ = s.Pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, s.Name+".idem").Scan(&exists)
	if exists {
		t.Fatal("down of 001 left the table")
	}
	code, out, errs = mig("-yes", "down")
	want(t, "down with nothing applied", code, 1, out, errs)
	if !strings.Contains(errs, "no applied migration to roll back") {
		t.Errorf("down with nothing applied: %q", errs)
	}
}

// A database migrated before versions were recorded (no version table):
// status says so, down refuses, up records.
func TestMigrateUnrecordedDeployment(t *testing.T) {
	s, mig := migrateOn(t)
	ctx := context.Background()
	if err := postgres.Migrate(ctx, s.Pool, postgres.WithSchema(s.Name)); err != nil {
		t.Fatal(err)
	}
	// What today's deployments look like: the table, no version table.
	if _, err := s.Pool.Exec(ctx, "DROP TABLE "+s.Name+".idempotency_requests_migrations"); err != nil {
		t.Fatal(err)
	}
	code, out, errs := mig("status")
	want(t, "status", code, 0, out, errs)
	if !strings.Contains(out, "no versions are recorded") {
		t.Fatalf("status of an unrecorded deployment:\n%s", out)
	}
	code, out, errs = mig("-yes", "down")
	want(t, "down", code, 1, out, errs)
	if !strings.Contains(errs, "run up first") {
		t.Fatalf("down of an unrecorded deployment: %q", errs)
	}
	code, out, errs = mig("up")
	want(t, "up", code, 0, out, errs)
	code, out, _ = mig("status")
	if code != 0 || strings.Contains(out, " no\n") || strings.Contains(out, "no versions") {
		t.Fatalf("status after up:\n%s", out)
	}
}

func TestStatsPendingInspectResolve(t *testing.T) {
	secret := []byte("s3cret")
	d := newDB(t, secret)
	t.Setenv("ONCEKEY_KEY_SECRET", string(secret))
	ctx := context.Background()
	const tenant, op = "tenant-acme-7", "POST /charges"
	older := durable.Scope{Tenant: tenant, Operation: op, Key: "key-older-0001"}
	unc := durable.Scope{Tenant: tenant, Operation: op, Key: "key-uncertain-0002"}
	done := durable.Scope{Tenant: tenant, Operation: op, Key: "key-done-0003"}
	live := durable.Scope{Tenant: tenant, Operation: op, Key: "key-live-0004"}
	var worker storeapi.ClaimResult
	for _, sc := range []durable.Scope{older, unc} {
		worker = claimScope(t, d.store, sc, time.Hour)
		if err := d.store.MarkUncertain(ctx, worker.Ref, worker.Token); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // distinct created_at: order, not timing, is asserted
	}
	r := claimScope(t, d.store, done, time.Hour)
	if err := d.store.Complete(ctx, nil, r.Ref, r.Token, durable.Result{StatusCode: 201, Body: []byte("ok"), Version: 1}); err != nil {
		t.Fatal(err)
	}
	claimScope(t, d.store, live, time.Hour)

	// stats -json counts what the store holds.
	code, out, errs := oncekey(t, "", d.cmd("stats", "-json")...)
	want(t, "stats -json", code, 0, out, errs)
	var st statsJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stats -json: %v\n%s", err, out)
	}
	if st.Uncertain != 2 || st.Completed != 1 || st.Processing != 1 || st.Failed != 0 {
		t.Fatalf("stats = %+v; want 2 uncertain, 1 completed, 1 processing", st)
	}
	code, out, errs = oncekey(t, "", d.cmd("stats")...)
	want(t, "stats", code, 0, out, errs)
	if !strings.Contains(out, "uncertain                  2") {
		t.Fatalf("stats table:\n%s", out)
	}

	// pending: the two uncertain ones, oldest first; not the finished or live ones.
	code, out, errs = oncekey(t, "", d.cmd("pending")...)
	want(t, "pending", code, 0, out, errs)
	refOf := func(sc durable.Scope) durable.Ref { rf, _ := d.store.Ref(sc); return rf }
	iOld, iUnc := strings.Index(out, refOf(older).OperationID()), strings.Index(out, refOf(unc).OperationID())
	if iOld < 0 || iUnc < 0 || iOld > iUnc || strings.Contains(out, refOf(done).OperationID()) || strings.Contains(out, refOf(live).OperationID()) {
		t.Fatalf("pending (want %s then %s only):\n%s", refOf(older).OperationID(), refOf(unc).OperationID(), out)
	}
	noSecrets(t, "pending", out, tenant, older.Key, unc.Key)

	// inspect by tenant + operation + key: the key hashed with the secret.
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", tenant, "-operation", op, "-key", done.Key, "-json")...)
	want(t, "inspect", code, 0, out, errs)
	var rec recordJSON
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.State != "completed" || rec.Status == nil || *rec.Status != 201 || rec.Generation != r.Token.Generation || rec.OperationID != r.Ref.OperationID() {
		t.Fatalf("inspect = %+v; want completed, 201, generation %d", rec, r.Token.Generation)
	}
	noSecrets(t, "inspect -json", out, tenant, done.Key)
	// The key from stdin, table output.
	code, out, errs = oncekey(t, done.Key+"\n", d.cmd("inspect", "-tenant", tenant, "-operation", op, "-key", "-")...)
	want(t, "inspect -key -", code, 0, out, errs)
	if !strings.Contains(out, "result status    201") {
		t.Fatalf("inspect table:\n%s", out)
	}
	noSecrets(t, "inspect", out, tenant, done.Key)
	// Negative controls: without the secret the key hashes to another record;
	// another tenant never sees it.
	t.Setenv("ONCEKEY_KEY_SECRET", "")
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", tenant, "-operation", op, "-key", done.Key)...)
	want(t, "inspect without the secret", code, 1, out, errs)
	if !strings.Contains(errs, "no such operation") {
		t.Fatalf("inspect without the secret: %q", errs)
	}
	t.Setenv("ONCEKEY_KEY_SECRET", string(secret))
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", "other-tenant", "-operation", op, "-key", done.Key)...)
	want(t, "inspect, another tenant", code, 1, out, errs)

	// inspect -id finds a pending operation within its tenant only.
	id := refOf(unc).OperationID()
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", tenant, "-id", id)...)
	want(t, "inspect -id", code, 0, out, errs)
	if !strings.Contains(out, "uncertain") {
		t.Fatalf("inspect -id:\n%s", out)
	}
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", "other-tenant", "-id", id)...)
	want(t, "inspect -id, another tenant", code, 1, out, errs)

	// inspect -id of a finished record: read through the store's read by
	// operation identity when it has one (migration 003); otherwise a clear
	// refusal.
	code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", tenant, "-id", r.Ref.OperationID())...)
	if _, ok := any(d.store).(byOperationID); ok {
		want(t, "inspect -id of a completed operation", code, 0, out, errs)
		if !strings.Contains(out, "completed") {
			t.Fatalf("inspect -id of a completed operation:\n%s", out)
		}
		code, out, errs = oncekey(t, "", d.cmd("inspect", "-tenant", "other-tenant", "-id", r.Ref.OperationID())...)
		want(t, "inspect -id of a completed operation, another tenant", code, 1, out, errs)
	} else {
		want(t, "inspect -id of a completed operation, no lookup", code, 1, out, errs)
		if !strings.Contains(errs, "cannot read other records by operation id") {
			t.Fatalf("inspect -id without the store's lookup: %q", errs)
		}
	}

	// resolve a live lease: refused, nothing written.
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", live.Key, "-format", "http", "-as", "failed", "-status", "402", "-reason", "x", "-operator", "ana")...)
	want(t, "resolve a live lease", code, 1, out, errs)
	if !strings.Contains(errs, "not adoptable") {
		t.Fatalf("resolve a live lease: %q", errs)
	}

	// resolve by id: completed with a result and a reason; the original
	// worker's late completion is fenced.
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-id", id, "-format", "http", "-as", "completed",
		"-status", "201", "-body", `{"charge":"ch_1"}`, "-content-type", "application/json", "-reason", "PSP dashboard shows ch_1 captured", "-operator", "ana")...)
	want(t, "resolve", code, 0, out, errs)
	got, err := d.store.Get(ctx, worker.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != durable.Completed || got.Result == nil || string(got.Result.Body) != `{"charge":"ch_1"}` || got.Token.Generation <= worker.Token.Generation {
		t.Fatalf("after resolve: %+v; want completed with the body above generation %d", got, worker.Token.Generation)
	}
	if err := d.store.Complete(ctx, nil, worker.Ref, worker.Token, durable.Result{StatusCode: 500}); !errors.Is(err, durable.ErrFenced) {
		t.Fatalf("the original worker's Complete after resolve: %v; want ErrFenced", err)
	}
	var reason, operator string
	var gen int64
	if err := d.store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT reason, operator, generation FROM `+d.schema+`.idempotency_requests_resolutions WHERE operation_id = $1`, id).Scan(&reason, &operator, &gen)
	}); err != nil {
		t.Fatal(err)
	}
	if reason != "PSP dashboard shows ch_1 captured" || operator != "ana" || uint64(gen) != got.Token.Generation {
		t.Fatalf("recorded resolution: %q %q %d", reason, operator, gen)
	}
	// Resolving it again: finished, refused.
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", unc.Key, "-format", "http", "-as", "failed", "-status", "402", "-reason", "again", "-operator", "ana")...)
	want(t, "resolve a finished operation", code, 1, out, errs)

	// resolve by key as failed; pending is then empty.
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", tenant, "-operation", op, "-key", older.Key, "-format", "http", "-as", "failed", "-status", "402", "-reason", "declined", "-operator", "ana")...)
	want(t, "resolve -as failed", code, 0, out, errs)
	if got, _ := d.store.Get(ctx, refOf(older)); got.State != durable.Failed || got.Result.StatusCode != 402 {
		t.Fatalf("after resolve -as failed: %+v", got)
	}
	code, out, errs = oncekey(t, "", d.cmd("pending", "-json")...)
	want(t, "pending after resolve", code, 0, out, errs)
	if strings.TrimSpace(out) != "" {
		t.Fatalf("pending after resolving both: %s", out)
	}
}

// noSecrets fails when out shows the tenant or a raw key.
func noSecrets(t *testing.T, what, out string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("%s prints %q:\n%s", what, s, out)
		}
	}
}

func TestSweep(t *testing.T) {
	d := newDB(t, nil)
	ctx := context.Background()
	var refs []durable.Ref
	for i := range 5 {
		r := claimScope(t, d.store, durable.Scope{Tenant: "t", Operation: "op", Key: fmt.Sprintf("sweep-%d", i)}, time.Millisecond)
		if err := d.store.Complete(ctx, nil, r.Ref, r.Token, durable.Result{StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r.Ref)
	}
	stuck := claimScope(t, d.store, durable.Scope{Tenant: "t", Operation: "op", Key: "stuck"}, time.Millisecond)
	kept := claimScope(t, d.store, durable.Scope{Tenant: "t", Operation: "op", Key: "kept"}, time.Hour)
	if err := d.store.Complete(ctx, nil, kept.Ref, kept.Token, durable.Result{StatusCode: 200}); err != nil {
		t.Fatal(err)
	}
	// Sweep holds a record back until the clock passes its generation by two
	// minutes (see durable "Generations"); age the generations and the
	// expiry instead of waiting. Test setup, not the command's SQL.
	if err := d.store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE `+d.schema+`.idempotency_requests SET generation = 1, expires_at = clock_timestamp() - interval '1 second' WHERE key_hash <> $1`, kept.Ref.KeyHash[:])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	code, out, errs := oncekey(t, "", d.cmd("sweep", "-dry-run")...)
	want(t, "sweep -dry-run", code, 0, out, errs)
	if !strings.Contains(out, "dry run: 5 records") {
		t.Fatalf("sweep -dry-run: %s", out)
	}
	if _, err := d.store.Get(ctx, refs[0]); err != nil {
		t.Fatalf("dry run deleted: %v", err)
	}
	code, out, errs = oncekey(t, "", d.cmd("sweep", "-batch", "2", "-max-batches", "1")...)
	want(t, "sweep one batch", code, 0, out, errs)
	if !strings.Contains(out, "swept 2 records") {
		t.Fatalf("sweep -max-batches 1: %s", out)
	}
	code, out, errs = oncekey(t, "", d.cmd("sweep", "-batch", "2")...)
	want(t, "sweep", code, 0, out, errs)
	if !strings.Contains(out, "swept 3 records") || !strings.Contains(errs, "] 3/3") {
		t.Fatalf("sweep: stdout %q stderr %q", out, errs)
	}
	for _, r := range refs {
		if _, err := d.store.Get(ctx, r); !errors.Is(err, durable.ErrNotFound) {
			t.Fatalf("expired record not swept: %v", err)
		}
	}
	for _, r := range []durable.Ref{stuck.Ref, kept.Ref} {
		if _, err := d.store.Get(ctx, r); err != nil {
			t.Fatalf("sweep deleted a processing or unexpired record: %v", err)
		}
	}
}
