package redisproc

import (
	"strings"
	"testing"
)

func TestPing_RejectsAnotherProcessOnThePort(t *testing.T) {
	t.Parallel()
	srv := Start(t, Options{})
	if err := ping(srv.Addr(), srv.proc.Pid()); err != nil {
		t.Fatalf("ping of our own server: %v", err)
	}
	if err := ping(srv.Addr(), srv.proc.Pid()+100000); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("ping with another pid = %v, want an error", err)
	}
}
