package loopback

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
)

func TestOnFreePort_TriesAnotherPortOnlyWhenTaken(t *testing.T) {
	var ports []int
	err := OnFreePort(func(port int) error {
		ports = append(ports, port)
		if len(ports) < 3 {
			return fmt.Errorf("bind: %w", ErrAddrInUse)
		}
		return nil
	})
	if err != nil || len(ports) != 3 {
		t.Fatalf("OnFreePort = %v after %d tries, want nil after 3", err, len(ports))
	}
	other := errors.New("bad config")
	tries := 0
	if err := OnFreePort(func(int) error { tries++; return other }); !errors.Is(err, other) || tries != 1 {
		t.Fatalf("another error: %v after %d tries, want it after 1", err, tries)
	}
	tries = 0
	if err := OnFreePort(func(int) error { tries++; return ErrAddrInUse }); !errors.Is(err, ErrAddrInUse) || tries != 5 {
		t.Fatalf("always taken: %v after %d tries, want ErrAddrInUse after 5", err, tries)
	}
}

// fakeTB records what ForTest did.
type fakeTB struct {
	fatal, skipped string
	cleanups       int
}

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Cleanup(func())                    { f.cleanups++ }
func (f *fakeTB) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }
func (f *fakeTB) Skip(args ...any)                  { f.skipped = fmt.Sprint(args...) }

type server struct{}

func (*server) Close() {}

func TestForTest_MissingBinaryFailsUnderCI(t *testing.T) {
	missing := errors.New("no binary")
	for _, ci := range []string{"true", ""} {
		t.Setenv("CI", ci)
		f := &fakeTB{}
		ForTest(f, (*server)(nil), fmt.Errorf("start: %w", missing), missing)
		if ci == "true" && (f.fatal == "" || f.skipped != "") {
			t.Errorf("CI=true: fatal %q, skipped %q; want a failure, never a skip", f.fatal, f.skipped)
		}
		if ci == "" && f.skipped == "" {
			t.Errorf("CI unset: want a skip, got fatal %q", f.fatal)
		}
	}
	f := &fakeTB{}
	ForTest(f, (*server)(nil), errors.New("crashed"), missing)
	if f.fatal == "" {
		t.Error("another error did not fail the test")
	}
	f = &fakeTB{}
	ForTest(f, &server{}, nil, missing)
	if f.fatal != "" || f.skipped != "" || f.cleanups != 1 {
		t.Errorf("a started server: fatal %q, skipped %q, %d cleanups; want one cleanup", f.fatal, f.skipped, f.cleanups)
	}
}

// TestFreePort_BelowTheEphemeralRange: the ports FreePort gives are below
// the kernel's ephemeral range, where an outgoing connection cannot take
// them, and free.
func TestFreePort_BelowTheEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	if lo <= belowEphemeral+100 {
		if os.Getenv("CI") == "true" { // CI runs on Linux, where the range is read
			t.Fatalf("ephemeral range starts at %d (unreadable or too low)", lo)
		}
		t.Skipf("ephemeral range starts at %d: FreePort asks the kernel", lo)
	}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < belowEphemeral || port >= lo {
			t.Fatalf("FreePort = %d, want in [%d, %d)", port, belowEphemeral, lo)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d from FreePort is not free: %v", port, err)
		}
		l.Close()
	}
}
