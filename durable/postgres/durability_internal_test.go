package postgres

import (
	"strings"
	"testing"
)

// TestDurabilityProblems covers the settings a single test server cannot
// show at once: fsync, full_page_writes, asynchronous and synchronous
// standbys with each synchronous_commit, a session on a standby.
func TestDurabilityProblems(t *testing.T) {
	for _, c := range []struct {
		name                             string
		syncCommit, fsync, fpw, standbys string
		n                                int64
		recovery                         bool
		want                             string // "" or a substring
	}{
		{"durable", "on", "on", "on", "", 0, false, ""},
		{"remote_apply with sync standby", "remote_apply", "on", "on", "s1", 1, false, ""},
		{"on with sync standby", "on", "on", "on", "FIRST 1 (s1)", 1, false, ""},
		{"commit off", "off", "on", "on", "", 0, false, "set synchronous_commit = on"},
		{"fsync off", "on", "off", "on", "", 0, false, "set fsync = on"},
		{"fpw off", "on", "on", "off", "", 0, false, "set full_page_writes = on"},
		{"async standby", "on", "on", "on", "", 2, false, "set synchronous_standby_names"},
		{"local with sync standby", "local", "on", "on", "s1", 1, false, "synchronous_commit=local"},
		{"standby", "on", "on", "on", "", 0, true, "pg_is_in_recovery"},
	} {
		got := durabilityProblems(c.syncCommit, c.fsync, c.fpw, c.standbys, c.n, c.recovery)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
