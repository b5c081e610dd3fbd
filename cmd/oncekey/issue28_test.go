package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Issue 28: the items about the CLI, one test (or more) each.

// Flags go anywhere, as people type them: after the subcommand's word
// (migrate down -yes, as the README writes it; redis check -redis-url),
// before it, or interleaved; -h anywhere prints that subcommand's usage.
func TestFlagsAnywhere(t *testing.T) {
	for _, args := range [][]string{
		{"migrate", "up", "-h"},
		{"migrate", "status", "-schema", "x", "-h"},
		{"migrate", "down", "-yes", "-h"},
		{"redis", "check", "-pings", "3", "-h"},
		{"stats", "-json", "-h"},
	} {
		code, out, errs := oncekey(t, "", args...)
		want(t, strings.Join(args, " "), code, 0, out, errs)
		if !strings.Contains(out, "Usage: oncekey "+args[0]) {
			t.Errorf("%q prints no usage of %s:\n%s", args, args[0], out)
		}
	}
	// The word and the flags in any order: the checks after parsing answer.
	db := "postgres://postgres@127.0.0.1:1/test"
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"migrate", "down", "-database-url", db}, "add -yes to confirm"},
		{[]string{"migrate", "sideways", "-database-url", db}, `unknown action "sideways"`},
		{[]string{"migrate", "up", "-database-url", db, "down"}, "want exactly one of up, status, contract, down"},
		{[]string{"stats", "-database-url", db, "extra", "-json"}, `unexpected argument "extra"`},
		{[]string{"redis", "check", "-pings", "0", "-redis-url", "redis://127.0.0.1:1"}, "-pings must be 1 to 1000"},
		{[]string{"redis", "-pings", "0", "check"}, "-pings must be 1 to 1000"},
		{[]string{"redis", "check", "extra"}, `unexpected argument "extra"`},
	} {
		code, out, errs := oncekey(t, "", tc.args...)
		want(t, strings.Join(tc.args, " "), code, 2, out, errs)
		if !strings.Contains(errs, tc.msg) {
			t.Errorf("%q: stderr %q does not say %q", tc.args, errs, tc.msg)
		}
	}

	s := testenv.Postgres(t)
	url := testenv.DatabaseURL(t)
	code, out, errs := oncekey(t, "", "migrate", "up", "-database-url", url, "-schema", s.Name)
	want(t, "migrate up -database-url -schema", code, 0, out, errs)
	code, out, errs = oncekey(t, "", "migrate", "status", "-schema", s.Name, "-database-url", url)
	want(t, "migrate status -schema", code, 0, out, errs)
	if strings.Contains(out, " no\n") {
		t.Fatalf("status after up:\n%s", out)
	}
	code, out, errs = oncekey(t, "", "migrate", "down", "-yes", "-database-url", url, "-schema", s.Name)
	want(t, "migrate down -yes", code, 0, out, errs)
	if !strings.Contains(out, "rolled back version") {
		t.Fatalf("migrate down -yes: %s", out)
	}
	// "--" ends the flags; the word after it is the action.
	code, out, errs = oncekey(t, "", "migrate", "-database-url", url, "-schema", s.Name, "--", "up")
	want(t, "migrate -- up", code, 0, out, errs)

	testenv.Redis(t)
	code, out, errs = oncekey(t, "", "redis", "-pings", "2", "check", "-redis-url", testenv.RedisURL(t))
	want(t, "redis -pings 2 check -redis-url", code, 0, out, errs)
	if !strings.Contains(out, "over 2 PINGs") {
		t.Fatalf("redis check with interleaved flags:\n%s", out)
	}
}

// migrate up prints each version it applied, and "up to date" only when
// it applied none.
func TestMigrateUpPrintsWhatItApplied(t *testing.T) {
	_, mig := migrateOn(t)
	all, err := pgmigrate.List(postgres.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	var ms []pgmigrate.Migration // what up applies: not the contract steps
	for _, m := range all {
		if !m.Contract {
			ms = append(ms, m)
		}
	}
	last := ms[len(ms)-1]
	code, out, errs := mig("up")
	want(t, "migrate up of an empty schema", code, 0, out, errs)
	for _, m := range ms {
		if !strings.Contains(out, fmt.Sprintf("applied version %d (%s)\n", m.Version, m.Name)) {
			t.Errorf("migrate up of an empty schema does not list %s:\n%s", m.Name, out)
		}
	}
	for _, m := range all {
		if m.Contract && strings.Contains(out, m.Name) {
			t.Errorf("migrate up applied the contract step %s:\n%s", m.Name, out)
		}
	}
	if strings.Contains(out, "up to date") {
		t.Errorf("migrate up that applied %d migrations says up to date:\n%s", len(ms), out)
	}
	code, out, errs = mig("up")
	want(t, "migrate up again", code, 0, out, errs)
	if out != fmt.Sprintf("up to date: version %d (%s)\n", last.Version, last.Name) {
		t.Errorf("migrate up with nothing to apply: %q", out)
	}
	code, out, errs = mig("-yes", "down")
	want(t, "migrate down", code, 0, out, errs)
	code, out, errs = mig("up")
	want(t, "migrate up after down", code, 0, out, errs)
	if strings.Count(out, "applied version") != 1 || !strings.Contains(out, fmt.Sprintf("applied version %d (%s)", last.Version, last.Name)) {
		t.Errorf("migrate up after one step down: want only %s applied:\n%s", last.Name, out)
	}
}

// A malformed database or Redis URL is refused naming the part that
// failed and where the URL came from, never with the URL or a parse error
// holding it: neither the password nor any 4 characters of it are printed,
// by any command, from a flag or from the environment.
func TestBadURLsNeverPrintThePassword(t *testing.T) {
	const pw = "S3CRETpwQ7zK"
	dbURLs := []struct{ url, part, secret string }{
		// A '/' in the password ends the host: its rest is a port.
		{"postgres://postgres:" + pw[:8] + "/" + pw[8:] + "@127.0.0.1:5432/test", "invalid port", pw[:8] + "/" + pw[8:]},
		{"postgres://postgres:" + pw + "@127.0.0.1:badport/test", "invalid port", pw},
		// An unescaped '@' in the password: pgx's error held part of it.
		{"postgres://postgres:S3CR@ETpw#Q7zK@127.0.0.1:5432/test", "a '#' in the URL", "S3CR@ETpw#Q7zK"},
		{"postgres://postgres:S3CR@ETpw?Q7zK@127.0.0.1:5432/test", "an '@' after the host", "S3CR@ETpw?Q7zK"},
		// Only '@': pgx ended user:password at the first, and its
		// connection error showed the rest of the password as the host.
		{"postgres://postgres:S3CR@ETpwQ7zK@127.0.0.1:5432/test", "more than one '@' before the host", "S3CR@ETpwQ7zK"},
		// Parses, but the '@' landed in the path: the database name would be echoed.
		{"postgres://postgres:12/" + pw + "@127.0.0.1/test", "an '@' after the host", "12/" + pw},
		{"host=127.0.0.1 password='" + pw, "cannot be parsed", pw},
	}
	redisURLs := []struct{ url, part, secret string }{
		{"redis://:" + pw + "@127.0.0.1:badport/0", "invalid port", pw},
		{"redis://:12/" + pw + "@127.0.0.1:6379/0", "an '@' after the host", "12/" + pw},
		{"redis://:S3CR@ETpw#Q7zK@127.0.0.1:6379/0", "a '#' in the URL", "S3CR@ETpw#Q7zK"},
		{"redis://:S3CR@ETpwQ7zK@127.0.0.1:6379/0", "more than one '@' before the host", "S3CR@ETpwQ7zK"},
		{"redis://:" + pw + "@127.0.0.1:6379/x" + pw, "invalid database number", pw},
		{"http://:" + pw + "@127.0.0.1:6379/0", "the scheme must be", pw},
	}
	op := []string{"-tenant", "t", "-operation", "o", "-key", "k"}
	dbCommands := [][]string{
		{"migrate", "up"}, {"migrate", "status"}, {"migrate", "down", "-yes"},
		{"stats"}, {"pending"}, {"sweep"},
		append([]string{"inspect"}, op...),
		append([]string{"resolve", "-format", "http", "-as", "failed", "-status", "402", "-reason", "r", "-operator", "ana"}, op...),
	}
	check := func(what string, args []string, source, part, secret string) {
		t.Helper()
		code, out, errs := oncekey(t, "", args...)
		for i := 0; i+4 <= len(secret); i++ {
			if f := secret[i : i+4]; strings.Contains(out+errs, f) {
				t.Errorf("%s prints %q of the password:\nstdout: %s\nstderr: %s", what, f, out, errs)
				break
			}
		}
		if code != 2 || !strings.Contains(errs, source+": "+part) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", what, code, errs, source+": "+part)
		}
	}
	t.Setenv("REDIS_URL", "")
	for _, u := range dbURLs {
		for _, c := range dbCommands {
			t.Setenv("DATABASE_URL", "")
			check(strings.Join(c, " ")+" -database-url "+u.part, append(append([]string{}, c...), "-database-url", u.url), "-database-url", u.part, u.secret)
			t.Setenv("DATABASE_URL", u.url)
			check(strings.Join(c, " ")+" with DATABASE_URL "+u.part, c, "DATABASE_URL", u.part, u.secret)
		}
		t.Setenv("DATABASE_URL", "")
		check("redis check -database-url "+u.part, []string{"redis", "check", "-redis-url", "redis://127.0.0.1:1", "-database-url", u.url}, "-database-url", u.part, u.secret)
	}
	for _, u := range redisURLs {
		t.Setenv("REDIS_URL", "")
		check("redis check -redis-url "+u.part, []string{"redis", "check", "-redis-url", u.url}, "-redis-url", u.part, u.secret)
		t.Setenv("REDIS_URL", u.url)
		check("redis check with REDIS_URL "+u.part, []string{"redis", "check"}, "REDIS_URL", u.part, u.secret)
	}
}

// On a schema nobody migrated every command says which table is missing
// and the migrate command (with the same -schema and -table) that creates
// it, instead of a bare 'relation "idempotency_requests" does not exist'.
func TestUnmigratedSchema(t *testing.T) {
	s := testenv.Postgres(t)
	url := testenv.DatabaseURL(t)
	op := []string{"-tenant", "t", "-operation", "o", "-key", "k"}
	for _, c := range [][]string{
		{"stats"}, {"pending"}, {"sweep"}, {"sweep", "-dry-run"},
		append([]string{"inspect"}, op...),
		append([]string{"resolve", "-format", "http", "-as", "failed", "-status", "402", "-reason", "r", "-operator", "ana"}, op...),
	} {
		for _, tc := range []struct {
			flags      []string
			table, run string
		}{
			{[]string{"-database-url", url, "-schema", s.Name}, s.Name + ".idempotency_requests", "run oncekey migrate up -schema " + s.Name + " (with the same database)"},
			{[]string{"-database-url", url, "-schema", s.Name, "-table", "idem"}, s.Name + ".idem", "run oncekey migrate up -schema " + s.Name + " -table idem (with the same database)"},
			// No -schema: the search_path's schema is named.
			{[]string{"-database-url", s.URL}, s.Name + ".idempotency_requests", "run oncekey migrate up (with the same database)"},
		} {
			args := append(append([]string{}, c...), tc.flags...)
			code, out, errs := oncekey(t, "", args...)
			want(t, strings.Join(args, " "), code, 1, out, errs)
			if !strings.Contains(errs, "the table "+tc.table+" does not exist") || !strings.Contains(errs, tc.run) || strings.Contains(errs, "SQLSTATE") {
				t.Errorf("%q: stderr %q; want the table %s named and %q", args, errs, tc.table, tc.run)
			}
		}
	}
	var exists bool
	if err := s.Pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, s.Name+".idempotency_requests_resolutions").Scan(&exists); err != nil || exists {
		t.Fatalf("resolve on an unmigrated schema created its table: %v %v", exists, err)
	}
}

// -key accepts the key as the Idempotency-Key header carries it: an RFC
// 8941 sf-string, unquoted as claimhttp does; -raw-key takes it as it is.
func TestInspectHeaderFormKey(t *testing.T) {
	d := newDB(t, nil)
	const tenant, op = "acme", "POST /orders"
	plain := claimScope(t, d.store, durable.Scope{Tenant: tenant, Operation: op, Key: "ord-7f3a"}, time.Hour)
	escaped := claimScope(t, d.store, durable.Scope{Tenant: tenant, Operation: op, Key: `a"b\c`}, time.Hour)
	quoted := claimScope(t, d.store, durable.Scope{Tenant: tenant, Operation: op, Key: `"q-1"`}, time.Hour)
	for _, tc := range []struct {
		key  []string
		want durable.Ref
	}{
		{[]string{"-key", `"ord-7f3a"`}, plain.Ref},
		{[]string{"-key", ` "ord-7f3a"	`}, plain.Ref},
		{[]string{"-key", "ord-7f3a"}, plain.Ref},
		{[]string{"-key", `"a\"b\\c"`}, escaped.Ref},
		{[]string{"-key", `a"b\c`}, escaped.Ref},
		{[]string{"-key", `"q-1"`, "-raw-key"}, quoted.Ref},
		{[]string{"-key", `"\"q-1\""`}, quoted.Ref},
	} {
		args := d.cmd("inspect", append([]string{"-tenant", tenant, "-operation", op, "-json"}, tc.key...)...)
		code, out, errs := oncekey(t, "", args...)
		want(t, strings.Join(tc.key, " "), code, 0, out, errs)
		var rec recordJSON
		if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.OperationID != tc.want.OperationID() {
			t.Errorf("inspect %q: %s (%v); want %s", tc.key, out, err, tc.want.OperationID())
		}
	}
	// From stdin, in the header form.
	code, out, errs := oncekey(t, `"ord-7f3a"`+"\n", d.cmd("inspect", "-tenant", tenant, "-operation", op, "-key", "-")...)
	want(t, "inspect -key - with a quoted key", code, 0, out, errs)
	for _, tc := range []struct{ key, msg string }{
		{`"ord-7f3a`, "unterminated"},
		{`"ord\n"`, `only \" and \\ are escapes`},
		{`"ord";x=1`, "after the closing quote"},
	} {
		code, out, errs := oncekey(t, "", d.cmd("inspect", "-tenant", tenant, "-operation", op, "-key", tc.key)...)
		want(t, "inspect -key "+tc.key, code, 2, out, errs)
		if !strings.Contains(errs, tc.msg) || strings.Contains(errs, "ord") {
			t.Errorf("inspect -key %s: stderr %q; want %q and no key", tc.key, errs, tc.msg)
		}
	}
}

// uncertainOp claims key and marks it uncertain: something to resolve.
func uncertainOp(t *testing.T, d testDB, key string) storeapi.ClaimResult {
	t.Helper()
	w := claimScope(t, d.store, durable.Scope{Tenant: "acme", Operation: "POST /charges", Key: key}, time.Hour)
	if err := d.store.MarkUncertain(context.Background(), w.Ref, w.Token); err != nil {
		t.Fatal(err)
	}
	return w
}

// untouched fails unless the record is still in state at w's token.
func untouched(t *testing.T, what string, d testDB, w storeapi.ClaimResult, state durable.State) {
	t.Helper()
	got, err := d.store.Get(context.Background(), w.Ref)
	if err != nil || got.State != state || got.Token != w.Token {
		t.Fatalf("%s: the record is now %+v (%v); want it %s at %v, untouched", what, got, err, state, w.Token)
	}
}

// resolutions returns the recorded resolutions of the operation: operator
// and status of each.
func resolutions(t *testing.T, d testDB, id string) []string {
	t.Helper()
	var got []string
	err := d.store.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT operator, status_code FROM `+d.schema+`.idempotency_requests_resolutions WHERE operation_id = $1 ORDER BY generation`, id)
		if err != nil {
			return err
		}
		for rows.Next() {
			var op string
			var st int
			if err := rows.Scan(&op, &st); err != nil {
				return err
			}
			got = append(got, fmt.Sprintf("%s %d", op, st))
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// -format http: -as failed takes a status of 400 or more, -as completed
// one below 400, as claimhttp stores them; a contradiction is refused
// (exit 2) and writes nothing.
func TestResolveStatusMustMatchState(t *testing.T) {
	d := newDB(t, nil)
	w := uncertainOp(t, d, "k-status")
	base := []string{"-tenant", "acme", "-operation", "POST /charges", "-key", "k-status", "-format", "http", "-reason", "r", "-operator", "ana"}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"-as", "failed", "-status", "201"}, "-as failed needs a status of 400 to 599, got 201"},
		{[]string{"-as", "failed", "-status", "399"}, "-as failed needs a status of 400 to 599, got 399"},
		{[]string{"-as", "completed", "-status", "404"}, "-as completed needs a status below 400, got 404"},
		{[]string{"-as", "completed", "-status", "500"}, "-as completed needs a status below 400, got 500"},
	} {
		code, out, errs := oncekey(t, "", d.cmd("resolve", append(append([]string{}, base...), tc.args...)...)...)
		want(t, strings.Join(tc.args, " "), code, 2, out, errs)
		if !strings.Contains(errs, tc.msg) {
			t.Errorf("%q: stderr %q does not say %q", tc.args, errs, tc.msg)
		}
		untouched(t, strings.Join(tc.args, " "), d, w, durable.Uncertain)
	}
	if r := resolutions(t, d, w.Ref.OperationID()); len(r) != 0 {
		t.Fatalf("refused resolves recorded %v", r)
	}
	code, out, errs := oncekey(t, "", d.cmd("resolve", append(base, "-as", "failed", "-status", "400")...)...)
	want(t, "-as failed -status 400", code, 0, out, errs)
}

// Who resolves is recorded: -operator, else $USER; with neither, resolve
// refuses (exit 2) and writes nothing.
func TestResolveNeedsAnOperator(t *testing.T) {
	d := newDB(t, nil)
	w := uncertainOp(t, d, "k-operator")
	args := d.cmd("resolve", "-tenant", "acme", "-operation", "POST /charges", "-key", "k-operator", "-format", "http", "-as", "failed", "-status", "402", "-reason", "declined")
	t.Setenv("USER", "")
	code, out, errs := oncekey(t, "", args...)
	want(t, "resolve without -operator nor $USER", code, 2, out, errs)
	if !strings.Contains(errs, "-operator is required") {
		t.Fatalf("resolve without -operator nor $USER: %q", errs)
	}
	untouched(t, "resolve without an operator", d, w, durable.Uncertain)
	t.Setenv("USER", "bo")
	code, out, errs = oncekey(t, "", args...)
	want(t, "resolve with $USER", code, 0, out, errs)
	if r := resolutions(t, d, w.Ref.OperationID()); len(r) != 1 || r[0] != "bo 402" {
		t.Fatalf("recorded resolutions %v; want [bo 402]", r)
	}
	w2 := uncertainOp(t, d, "k-operator-2")
	t.Setenv("USER", "")
	code, out, errs = oncekey(t, "", d.cmd("resolve", "-tenant", "acme", "-operation", "POST /charges", "-key", "k-operator-2", "-format", "http", "-as", "completed", "-status", "200", "-reason", "ok", "-operator", "ana")...)
	want(t, "resolve -operator ana", code, 0, out, errs)
	if r := resolutions(t, d, w2.Ref.OperationID()); len(r) != 1 || r[0] != "ana 200" {
		t.Fatalf("recorded resolutions %v; want [ana 200]", r)
	}
}

// pending and resolve share one staleness rule (-stale, 5m): a processing
// operation whose lease expired a moment ago is neither listed nor
// settled; -stale 0 (or a shorter -stale) does both.
func TestPendingAndResolveShareStaleness(t *testing.T) {
	d := newDB(t, nil)
	ctx := context.Background()
	sc := durable.Scope{Tenant: "acme", Operation: "POST /charges", Key: "k-stale"}
	w, err := d.store.Claim(ctx, nil, storeapi.ClaimParams{Scope: sc, Fingerprint: "fp", Owner: uuid.New(), Lease: time.Millisecond, Retention: time.Hour})
	if err != nil || !w.Acquired {
		t.Fatalf("claim: %+v %v", w, err)
	}
	time.Sleep(50 * time.Millisecond) // the lease expired, well under 5 minutes ago
	id := w.Ref.OperationID()
	code, out, errs := oncekey(t, "", d.cmd("pending")...)
	want(t, "pending", code, 0, out, errs)
	if strings.Contains(out, id) {
		t.Fatalf("pending lists a lease expired 50ms ago:\n%s", out)
	}
	resolve := d.cmd("resolve", "-tenant", sc.Tenant, "-operation", sc.Operation, "-key", sc.Key, "-format", "http", "-as", "failed", "-status", "402", "-reason", "r", "-operator", "ana")
	code, out, errs = oncekey(t, "", resolve...)
	want(t, "resolve a lease expired 50ms ago", code, 1, out, errs)
	if !strings.Contains(errs, "expired less than -stale 5m0s ago") || !strings.Contains(errs, "-stale 0") {
		t.Fatalf("resolve a lease expired 50ms ago: %q", errs)
	}
	untouched(t, "resolve refused as not stale", d, w, durable.Processing)
	for _, stale := range []string{"0", "10ms"} {
		code, out, errs = oncekey(t, "", d.cmd("pending", "-stale", stale)...)
		want(t, "pending -stale "+stale, code, 0, out, errs)
		if !strings.Contains(out, id) {
			t.Fatalf("pending -stale %s does not list it:\n%s", stale, out)
		}
	}
	code, out, errs = oncekey(t, "", append(resolve, "-stale", "0")...)
	want(t, "resolve -stale 0", code, 0, out, errs)
	if got, _ := d.store.Get(ctx, w.Ref); got.State != durable.Failed {
		t.Fatalf("after resolve -stale 0: %+v", got)
	}
	code, out, errs = oncekey(t, "", "resolve", "-h")
	want(t, "resolve -h", code, 0, out, errs)
	if !strings.Contains(out, "-stale") || !strings.Contains(out, "-stale 0") {
		t.Fatalf("resolve -h does not document -stale:\n%s", out)
	}
}

// The resolutions table is migration 005's: resolve does not create it,
// and without it says to run migrate up; after migrate up it records.
func TestResolveNeedsMigration005(t *testing.T) {
	d := newDB(t, nil)
	w := uncertainOp(t, d, "k-005")
	var code int
	var out, errs string
	for !strings.Contains(out, "005_resolutions") { // the later versions first
		code, out, errs = oncekey(t, "", d.cmd("migrate", "-yes", "down")...)
		want(t, "migrate down", code, 0, out, errs)
		if strings.Contains(out, "version 4 ") {
			t.Fatalf("migrate down went past 005_resolutions: %s", out)
		}
	}
	args := d.cmd("resolve", "-tenant", "acme", "-operation", "POST /charges", "-key", "k-005", "-format", "http", "-as", "failed", "-status", "402", "-reason", "r", "-operator", "ana")
	code, out, errs = oncekey(t, "", args...)
	want(t, "resolve without 005", code, 1, out, errs)
	if !strings.Contains(errs, "the table "+d.schema+".idempotency_requests_resolutions does not exist") || !strings.Contains(errs, "run oncekey migrate up -schema "+d.schema) {
		t.Fatalf("resolve without 005: %q", errs)
	}
	untouched(t, "resolve without 005", d, w, durable.Uncertain)
	var exists bool
	if err := d.store.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, d.schema+".idempotency_requests_resolutions").Scan(&exists)
	}); err != nil || exists {
		t.Fatalf("resolve created the resolutions table itself: %v %v", exists, err)
	}
	code, out, errs = oncekey(t, "", d.cmd("migrate", "up")...)
	want(t, "migrate up", code, 0, out, errs)
	code, out, errs = oncekey(t, "", args...)
	want(t, "resolve after migrate up", code, 0, out, errs)
	if r := resolutions(t, d, w.Ref.OperationID()); len(r) != 1 {
		t.Fatalf("recorded resolutions %v", r)
	}
}

// stats reports the store's Durability; redis check shows the same
// finding for a -database-url. A session with synchronous_commit=off is
// the negative control.
func TestStatsAndRedisCheckShowDurability(t *testing.T) {
	d := newDB(t, nil)
	st, err := d.store.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := oncekey(t, "", d.cmd("stats")...)
	want(t, "stats", code, 0, out, errs)
	wantLine := regexp.MustCompile(`\ndurability +ok \(`)
	if st.Durability != "" {
		wantLine = regexp.MustCompile(`\ndurability +AT RISK: ` + regexp.QuoteMeta(st.Durability))
	}
	if !wantLine.MatchString(out) {
		t.Fatalf("stats does not say %q:\n%s", wantLine, out)
	}
	sep := "?"
	if strings.Contains(d.url, "?") {
		sep = "&"
	}
	lossy := d.url + sep + "synchronous_commit=off"
	code, out, errs = oncekey(t, "", "stats", "-database-url", lossy, "-schema", d.schema)
	want(t, "stats, synchronous_commit=off", code, 0, out, errs)
	if !strings.Contains(out, "AT RISK: synchronous_commit=off") {
		t.Fatalf("stats, synchronous_commit=off:\n%s", out)
	}
	code, out, errs = oncekey(t, "", "stats", "-json", "-database-url", lossy, "-schema", d.schema)
	want(t, "stats -json, synchronous_commit=off", code, 0, out, errs)
	var j statsJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil || j.Durable || !strings.Contains(j.DurabilityProblems, "synchronous_commit=off") {
		t.Fatalf("stats -json, synchronous_commit=off: %+v %v\n%s", j, err, out)
	}

	testenv.Redis(t)
	code, out, errs = oncekey(t, "", "redis", "check", "-redis-url", testenv.RedisURL(t), "-database-url", lossy)
	want(t, "redis check -database-url, synchronous_commit=off", code, 1, out, errs)
	if !strings.Contains(out, "postgres durability") || !strings.Contains(out, "FAIL: synchronous_commit=off") || !strings.Contains(errs, "check failed: postgres durability") {
		t.Fatalf("redis check -database-url, synchronous_commit=off:\n%s\n%s", out, errs)
	}
	if st.Durability == "" {
		code, out, errs = oncekey(t, "", "redis", "check", "-redis-url", testenv.RedisURL(t), "-database-url", d.url)
		want(t, "redis check -database-url", code, 0, out, errs)
		if !strings.Contains(out, "postgres durability") {
			t.Fatalf("redis check -database-url:\n%s", out)
		}
	}
	// Without -database-url, no line (DATABASE_URL is not read).
	t.Setenv("DATABASE_URL", lossy)
	code, out, errs = oncekey(t, "", "redis", "check", "-redis-url", testenv.RedisURL(t))
	want(t, "redis check", code, 0, out, errs)
	if strings.Contains(out, "postgres durability") {
		t.Fatalf("redis check without -database-url:\n%s", out)
	}
}
