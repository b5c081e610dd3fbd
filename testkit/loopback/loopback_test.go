package loopback

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
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

// TestServe_UntilTheTestEnds: a server given to Serve answers on the
// address it returns while the test runs; when the test ends, stop is
// called and Serve's cleanup waits for serve to return, after which
// nothing answers there.
func TestServe_UntilTheTestEnds(t *testing.T) {
	var addr string
	var returned atomic.Bool
	t.Run("Serving", func(t *testing.T) {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "up") })}
		serve := func(l net.Listener) error {
			defer returned.Store(true)
			return srv.Serve(l)
		}
		addr = Serve(t, serve, func() { srv.Close() })
		resp, err := http.Get("http://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if b, _ := io.ReadAll(resp.Body); string(b) != "up" {
			t.Fatalf("answer %q, want up", b)
		}
	})
	if !returned.Load() {
		t.Fatal("serve still running after the test ended")
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after the test ended", addr)
	}
}
