package claim_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/oncekey/oncekey/claim"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestClaimer_LogsNeverShowKeys(t *testing.T) {
	t.Parallel()
	var buf syncBuf
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := setup(t, withRedis, claim.WithLogger(logger))
	const secretKey = "acct-99887766-key"
	r := req(secretKey, "v1:a")
	old := mustClaim(t, e.c, r, claim.Acquired)
	e.expireLease(r)
	cur := mustClaim(t, e.c, r, claim.Acquired)          // logs a takeover
	_ = old.Lease.Complete(t.Context(), result("stale")) // logs a fenced completion
	if err := cur.Lease.Complete(t.Context(), result("ok")); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, cur.OperationID) {
		t.Fatalf("logs do not name the operation identity:\n%s", out)
	}
	for _, leak := range []string{secretKey, "acme"} {
		if strings.Contains(out, leak) {
			t.Fatalf("logs contain %q:\n%s", leak, out)
		}
	}
}
