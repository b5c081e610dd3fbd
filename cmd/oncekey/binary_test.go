package main

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/testkit/testenv"
)

// TestBinary_AsANewcomerTypesIt builds the oncekey command and runs it as
// the README writes its commands: flags after the subcommand's words, the
// database from DATABASE_URL, a bad URL with a password in it, a schema
// nobody migrated. The other tests call run in this process; this one is
// the binary a user gets, exit codes and streams included.
func TestBinary_AsANewcomerTypesIt(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "oncekey")
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build oncekey: %v", err)
	}
	if out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	s := testenv.Postgres(t)
	url := testenv.DatabaseURL(t)
	type result struct {
		code        int
		out, stderr string
	}
	oncekeyBin := func(env []string, args ...string) result {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}, env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return result{code, out.String(), errb.String()}
	}
	db := []string{"DATABASE_URL=" + url}

	r := oncekeyBin(db, "migrate", "up", "-schema", s.Name)
	if r.code != 0 || !strings.Contains(r.out, "applied version 1") {
		t.Fatalf("migrate up -schema: exit %d\n%s%s", r.code, r.out, r.stderr)
	}
	r = oncekeyBin(db, "migrate", "up", "-schema", s.Name)
	if r.code != 0 || !strings.Contains(r.out, "up to date") {
		t.Fatalf("migrate up again: exit %d\n%s%s", r.code, r.out, r.stderr)
	}
	r = oncekeyBin(db, "migrate", "down", "-yes", "-schema", s.Name)
	if r.code != 0 || !strings.Contains(r.out, "rolled back version") {
		t.Fatalf("migrate down -yes: exit %d\n%s%s", r.code, r.out, r.stderr)
	}
	r = oncekeyBin(db, "stats", "-schema", s.Name+"_never")
	if r.code != 1 || !strings.Contains(r.stderr, "run oncekey migrate up -schema "+s.Name+"_never") {
		t.Fatalf("stats on an unmigrated schema: exit %d\n%s%s", r.code, r.out, r.stderr)
	}
	const secret = "S3CRETpw"
	for _, args := range [][]string{
		{"redis", "check", "-redis-url", "redis://:" + secret + "@127.0.0.1:badport/0"},
		{"stats", "-database-url", "postgres://postgres:" + secret + "@127.0.0.1:badport/test"},
		{"stats", "-database-url", "postgres://postgres:S3CR@ETpw@127.0.0.1:5432/test"},
	} {
		r = oncekeyBin(nil, args...)
		if r.code != 2 || strings.Contains(r.out+r.stderr, "S3CR") || strings.Contains(r.out+r.stderr, "ETpw") {
			t.Fatalf("%s %s with a bad URL: exit %d, want 2 and no part of the password\n%s%s", args[0], args[1], r.code, r.out, r.stderr)
		}
	}
}
