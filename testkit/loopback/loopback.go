// Package loopback holds what the test kit's server processes (redisproc,
// pgbouncer) and the chaos suite's clusters share: a free loopback port,
// another try when a process took the port first, a server process started
// and waited for until it answers ([StartProcess], on Unix), and what a
// test does when the server's binary is not installed. It also serves a
// server of the test's own process (a gRPC server, say) on a loopback
// listener while the test runs ([Serve]). Like the rest of testkit it is
// not for applications and promises nothing between versions.
package loopback

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// ErrAddrInUse is what a start function returns to [OnFreePort] when its
// server found the port taken.
var ErrAddrInUse = errors.New("address already in use")

// FreePort returns a free loopback port below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default), where no
// outgoing connection is given a port: a port the kernel hands out for
// ":0" is one a busy machine's next outgoing connection may take before
// the server binds it (a Patroni node once lost its REST port that way).
// It tries random ports from 20000 up to the range, each bound and closed
// again, and asks the kernel for one when none is free or the range
// leaves no room. Another test's server may still take the port first;
// see [OnFreePort].
func FreePort() (int, error) {
	if lo := ephemeralLow(); lo > belowEphemeral+100 {
		for range 50 {
			port := belowEphemeral + rand.IntN(lo-belowEphemeral)
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// belowEphemeral is the lowest port FreePort picks.
const belowEphemeral = 20000

// ephemeralLow returns the first port of the kernel's ephemeral range, or
// 0 when it cannot be read (not Linux).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}

// OnFreePort calls start with a free port, and again with another while
// start fails with [ErrAddrInUse], five times at most. It returns start's
// last error.
func OnFreePort(start func(port int) error) error {
	var err error
	for range 5 {
		var port int
		if port, err = FreePort(); err != nil {
			return err
		}
		if err = start(port); !errors.Is(err, ErrAddrInUse) {
			return err
		}
	}
	return err
}

// Serve serves, in the test's process, on a listener of its own on a
// loopback port the kernel picks, until the test ends: then it calls stop
// and waits for serve to return. serve is the server's Serve
// (grpc.Server.Serve, http.Server.Serve), stop what makes it return
// (grpc.Server.Stop). It returns the listener's address.
func Serve(t TB, serve func(net.Listener) error, stop func()) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("loopback: listen: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = serve(lis)
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
	return lis.Addr().String()
}

// TB is the part of testing.TB the test kit's Start functions use; the
// packages do not import testing.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
	Skip(args ...any)
}

// ForTest is what a Start function does with the server New made: closed
// when the test ends. When err matches missing (the binary is not
// installed) the test fails with CI=true (CI must never pass by skipping)
// and is skipped with the reason otherwise; any other error fails it.
func ForTest[S interface{ Close() }](t TB, s S, err, missing error) S {
	t.Helper()
	switch {
	case errors.Is(err, missing) && os.Getenv("CI") == "true":
		t.Fatalf("%v [CI=true: a missing binary fails the test; .ci/run installs it]", err)
	case errors.Is(err, missing):
		t.Skip(err.Error())
	case err != nil:
		t.Fatalf("%v", err)
	default:
		t.Cleanup(s.Close)
	}
	return s
}
