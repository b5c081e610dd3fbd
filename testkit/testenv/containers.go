package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Containers: when a service's URL is unset and a Docker daemon answers,
// the service comes from a container that the oncekey-containers command
// (module github.com/oncekey/oncekey/testkit/containers, which holds
// testcontainers-go) starts for this test binary. This package starts it as
// a subprocess (go run, or $ONCEKEY_CONTAINERS_BIN when set) and asks it for
// services over a pipe: the first test that needs PostgreSQL starts the
// PostgreSQL container, and so on, one of each per test binary. When the
// binary exits, however it exits, the pipe closes and the command removes
// its containers. The library's module graph never sees testcontainers.
//
// ONCEKEY_CONTAINERS=off turns this off (the local defaults are used).

// launcherPkg is the command's package, run with go run from the
// workspace.
const launcherPkg = "github.com/oncekey/oncekey/testkit/containers/cmd/oncekey-containers"

// launcherWait bounds the wait for one answer of the command, which the
// first time includes compiling it and starting the container.
const launcherWait = 5 * time.Minute

var launcher struct {
	mu      sync.Mutex
	checked bool  // whether Docker was looked for
	docker  error // nil when a daemon answered
	in      *os.File
	out     *bufio.Reader
	outf    *os.File
	log     *os.File // the command's stderr, unlinked, read on failure
	broken  error    // the command failed; no more attempts
	urls    map[string]string
	errs    map[string]error
}

// ContainersEnabled reports whether services with no URL set come from
// containers: ONCEKEY_CONTAINERS is not "off" and a Docker daemon answers
// (DOCKER_HOST, else /var/run/docker.sock). The answer is looked up once
// per test binary.
func ContainersEnabled() bool {
	if os.Getenv("ONCEKEY_CONTAINERS") == "off" {
		return false
	}
	launcher.mu.Lock()
	defer launcher.mu.Unlock()
	return dockerLocked() == nil
}

func dockerLocked() error {
	if !launcher.checked {
		launcher.checked = true
		launcher.docker = pingDocker()
	}
	return launcher.docker
}

// pingDocker asks the daemon of DOCKER_HOST (unix:// or tcp://, without
// TLS), else of /var/run/docker.sock, for /_ping.
func pingDocker() error {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = "unix:///var/run/docker.sock"
	}
	u, err := url.Parse(host)
	if err != nil {
		return fmt.Errorf("DOCKER_HOST %q: %w", host, err)
	}
	var network, addr string
	switch u.Scheme {
	case "unix":
		network, addr = "unix", u.Path
		if _, err := os.Stat(addr); err != nil {
			return err
		}
	case "tcp":
		if os.Getenv("DOCKER_TLS_VERIFY") != "" {
			return errors.New("DOCKER_HOST over TLS is not looked for")
		}
		network, addr = "tcp", u.Host
	default:
		return fmt.Errorf("DOCKER_HOST %q: scheme not looked for", host)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	resp, err := c.Get("http://docker/_ping")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("docker /_ping: %s", resp.Status)
	}
	return nil
}

// fromContainer returns the URL of service ("postgres", "redis", "nats",
// "rabbitmq") from this binary's container, starting the command and the
// container the first time. ok is false when containers are off or Docker
// does not answer; err is set when they should have worked and did not.
func fromContainer(service string) (u string, ok bool, err error) {
	if os.Getenv("ONCEKEY_CONTAINERS") == "off" {
		return "", false, nil
	}
	launcher.mu.Lock()
	defer launcher.mu.Unlock()
	if dockerLocked() != nil {
		return "", false, nil
	}
	if u, ok := launcher.urls[service]; ok {
		return u, true, nil
	}
	if err, ok := launcher.errs[service]; ok {
		return "", true, err
	}
	u, err = askLocked(service)
	if launcher.urls == nil {
		launcher.urls, launcher.errs = map[string]string{}, map[string]error{}
	}
	if err != nil {
		err = fmt.Errorf("testenv: %s container: %w", service, err)
		launcher.errs[service] = err
		return "", true, err
	}
	launcher.urls[service] = u
	return u, true, nil
}

func askLocked(service string) (string, error) {
	if launcher.broken != nil {
		return "", launcher.broken
	}
	if launcher.in == nil {
		if err := startLocked(); err != nil {
			launcher.broken = err
			return "", err
		}
	}
	if _, err := fmt.Fprintln(launcher.in, service); err != nil {
		launcher.broken = fmt.Errorf("oncekey-containers: %w", err)
		return "", launcher.broken
	}
	_ = launcher.outf.SetReadDeadline(time.Now().Add(launcherWait))
	line, err := launcher.out.ReadString('\n')
	if err != nil {
		launcher.broken = fmt.Errorf("oncekey-containers did not answer: %w%s", err, logTail())
		return "", launcher.broken
	}
	line = strings.TrimSpace(line)
	switch {
	case strings.HasPrefix(line, "url "):
		return strings.TrimPrefix(line, "url "), nil
	case strings.HasPrefix(line, "error "):
		return "", errors.New(strings.TrimPrefix(line, "error "))
	}
	return "", fmt.Errorf("oncekey-containers: unexpected answer %q", line)
}

// startLocked starts the command with -serve. Its stdin is a pipe only
// this process holds, so its end (this process's) removes the containers;
// its stderr goes to a file that is read when it fails to answer.
func startLocked() error {
	var cmd *exec.Cmd
	if bin := os.Getenv("ONCEKEY_CONTAINERS_BIN"); bin != "" {
		cmd = exec.Command(bin, "-serve")
	} else {
		gobin, err := exec.LookPath("go")
		if err != nil {
			return fmt.Errorf("go not on PATH to run %s (set ONCEKEY_CONTAINERS_BIN): %w", launcherPkg, err)
		}
		cmd = exec.Command(gobin, "run", launcherPkg, "-serve")
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return err
	}
	logf, err := os.CreateTemp("", "oncekey-containers-*.log")
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, logf
	err = cmd.Start()
	inR.Close()
	outW.Close()
	// The file is unlinked at once: the command writes to it, this process
	// reads it on failure, and nothing is left behind either way.
	os.Remove(logf.Name())
	if err != nil {
		logf.Close()
		inW.Close()
		outR.Close()
		return err
	}
	launcher.in, launcher.outf, launcher.out, launcher.log = inW, outR, bufio.NewReader(outR), logf
	// Nobody waits for it: it outlives this process by the time it takes to
	// remove the containers.
	_ = cmd.Process.Release()
	return nil
}

// logTail returns the end of the command's stderr, for an error.
func logTail() string {
	if launcher.log == nil {
		return ""
	}
	b := make([]byte, 4096)
	st, err := launcher.log.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-int64(len(b)), 0)
	n, _ := launcher.log.ReadAt(b, off)
	if n == 0 {
		return ""
	}
	return "\noncekey-containers log (end):\n" + string(b[:n])
}
