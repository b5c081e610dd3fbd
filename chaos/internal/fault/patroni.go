package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoPatroni is returned by [NewPatroni] when patroni or etcd is not
// installed (Debian: patroni, etcd-server).
var ErrNoPatroni = errors.New("fault: patroni and etcd not found; install the Debian packages patroni and etcd-server")

// Patroni is a throwaway PostgreSQL cluster managed by Patroni: one etcd
// (the DCS) and n PostgreSQL nodes, all on loopback ports in one
// temporary directory. Each node reaches etcd through a [Proxy] of its
// own, so that one node can be cut off from the DCS alone, which is how
// Patroni's leader lock prevents split brain: a leader that cannot renew
// its lock demotes itself before another node's lock can be taken.
//
// Timings are Patroni's smallest sensible ones: ttl 10 s, loop_wait 1 s,
// retry_timeout 3 s; a failover takes about the ttl.
type Patroni struct {
	dir, scope string
	sync       bool
	etcd       *exec.Cmd
	etcdPort   int
	nodes      []*patroniNode
	http       *http.Client
	mu         sync.Mutex
}

type patroniNode struct {
	name         string
	pgPort, rest int
	dcs          *Proxy
	repl         *Proxy // in front of pgPort: what the other nodes replicate through
	cmd          *exec.Cmd
	done         chan struct{}
	configFile   string
	logFile      *os.File
	stopped      bool
}

// PatroniInstalled returns [ErrNoPatroni] when patroni or etcd is not on
// the PATH.
func PatroniInstalled() error {
	for _, bin := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(bin); err != nil {
			return ErrNoPatroni
		}
	}
	return nil
}

// PatroniTTL is the leader lock's time to live of a [Patroni] cluster.
const PatroniTTL = 10 * time.Second

// NewPatroni starts etcd and n Patroni nodes and waits until the cluster
// has a leader that accepts writes and, with synchronous, a synchronous
// standby (synchronous_mode: true: a commit is acknowledged once a
// standby has it, and Patroni promotes only that standby). Without
// synchronous the replicas are asynchronous and Patroni may promote one
// that lacks acknowledged commits (within maximum_lag_on_failover): the
// negative control.
func NewPatroni(ctx context.Context, n int, synchronous bool) (_ *Patroni, err error) {
	if err := PatroniInstalled(); err != nil {
		return nil, err
	}
	bin, err := PostgresBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "oncekey-patroni-")
	if err != nil {
		return nil, err
	}
	p := &Patroni{dir: dir, scope: filepath.Base(dir), sync: synchronous, http: &http.Client{Timeout: 2 * time.Second}}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if err := p.startEtcd(ctx); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		if out, err := exec.CommandContext(ctx, "chown", "-R", "postgres:postgres", dir).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("fault: chown %s: %w: %s", dir, err, out)
		}
	}
	// The first node bootstraps alone (initdb), then the others clone it.
	// Each node's ports are picked just before it starts: picked with the
	// first node's, a port stayed free for a minute or more while it
	// bootstrapped, another test took it, and Patroni exited ("Couldn't
	// start a service on ...").
	for i := range n {
		if err := p.addNode(fmt.Sprintf("node%d", i+1), bin); err != nil {
			return nil, err
		}
		if i > 0 {
			continue
		}
		if _, err := p.WaitLeader(ctx, 90*time.Second); err != nil {
			return nil, err
		}
	}
	// A replica's ports are bound only once it has cloned the leader,
	// seconds after they were picked: another test can take one
	// meanwhile. Such a node is started again on new ports (twice at
	// most) rather than failing the cluster.
	for retries := 0; ; retries++ {
		err := p.waitHealthy(ctx, 120*time.Second, p.portTaken)
		if err == nil {
			return p, nil
		}
		i := slices.IndexFunc(p.nodes, p.portTaken)
		if i <= 0 || retries == 2 {
			return nil, err
		}
		if err := p.replaceNode(i, bin); err != nil {
			return nil, err
		}
	}
}

// nodePort picks the PostgreSQL port of the node named name; a test
// replaces it to hand a node a port that is taken.
var nodePort = func(string) (int, error) { return freePort() }

// portTaken reports whether node n's log says a port it was given was
// taken by the time it bound it.
func (p *Patroni) portTaken(n *patroniNode) bool {
	b, _ := os.ReadFile(filepath.Join(p.dir, n.name+".log"))
	return bytes.Contains(b, []byte("could not create listen socket")) || bytes.Contains(b, []byte("Couldn't start a service"))
}

// replaceNode kills replica i, drops its data, log and proxies, and starts
// it again under the same name on new ports.
func (p *Patroni) replaceNode(i int, bin string) error {
	old := p.nodes[i]
	if err := p.Kill(i); err != nil {
		return err
	}
	old.dcs.Close()
	old.repl.Close()
	_ = os.Rename(filepath.Join(p.dir, old.name+".log"), filepath.Join(p.dir, old.name+".port-taken.log"))
	if err := os.RemoveAll(filepath.Join(p.dir, old.name)); err != nil {
		return err
	}
	p.nodes[i] = &patroniNode{name: old.name}
	return p.setUpNode(p.nodes[i], bin)
}

func (p *Patroni) startEtcd(ctx context.Context) error {
	var err error
	if p.etcdPort, err = freePort(); err != nil {
		return err
	}
	peer, err := freePort()
	if err != nil {
		return err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", p.etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	log, err := os.Create(filepath.Join(p.dir, "etcd.log"))
	if err != nil {
		return err
	}
	p.etcd = exec.Command("etcd", "--name", "etcd0", "--data-dir", filepath.Join(p.dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "etcd0="+peerURL, "--initial-cluster-state", "new",
		"--enable-v2=true", "--log-level", "warn")
	p.etcd.Stdout, p.etcd.Stderr = log, log
	p.etcd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.etcd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("fault: etcd: %w", err)
	}
	go func() { _ = p.etcd.Wait(); log.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := p.http.Get(client + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `"true"`) {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("fault: etcd did not become healthy: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p *Patroni) config(n *patroniNode, bin string) string {
	data := filepath.Join(p.dir, n.name)
	return fmt.Sprintf(`scope: %s
name: %s
log:
  level: INFO
restapi:
  listen: 127.0.0.1:%d
  connect_address: 127.0.0.1:%d
etcd3:
  host: %s
  use_proxies: true
bootstrap:
  dcs:
    ttl: %d
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: %v
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 200
  initdb:
  - encoding: UTF8
  - auth: trust
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%d
  connect_address: %s
  data_dir: %s
  bin_dir: %s
  pgpass: %s
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
  parameters:
    unix_socket_directories: %s
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
`, p.scope, n.name, n.rest, n.rest, n.dcs.Addr(), int(PatroniTTL/time.Second), p.sync,
		n.pgPort, n.repl.Addr(), data, bin, filepath.Join(p.dir, n.name+".pgpass"), p.dir)
}

// addNode adds a node named name and sets it up (setUpNode).
func (p *Patroni) addNode(name, bin string) error {
	node := &patroniNode{name: name}
	p.nodes = append(p.nodes, node) // so that Close closes its proxies
	return p.setUpNode(node, bin)
}

// setUpNode picks the ports of node, starts its proxies, writes its
// configuration and starts it.
func (p *Patroni) setUpNode(node *patroniNode, bin string) (err error) {
	if node.pgPort, err = nodePort(node.name); err != nil {
		return err
	}
	if node.rest, err = freePort(); err != nil {
		return err
	}
	if node.dcs, err = NewProxy(fmt.Sprintf("127.0.0.1:%d", p.etcdPort)); err != nil {
		return err
	}
	if node.repl, err = NewProxy(fmt.Sprintf("127.0.0.1:%d", node.pgPort)); err != nil {
		return err
	}
	node.configFile = filepath.Join(p.dir, node.name+".yml")
	if err := os.WriteFile(node.configFile, []byte(p.config(node, bin)), 0o644); err != nil {
		return err
	}
	return p.startNode(node)
}

func (p *Patroni) startNode(n *patroniNode) error {
	log, err := os.OpenFile(filepath.Join(p.dir, n.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", "-u", "postgres", "--", "patroni", n.configFile)
	} else {
		cmd = exec.Command("patroni", n.configFile)
	}
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("fault: patroni %s: %w", n.name, err)
	}
	p.mu.Lock()
	n.cmd, n.logFile, n.stopped, n.done = cmd, log, false, make(chan struct{})
	done := n.done
	p.mu.Unlock()
	go func() { _ = cmd.Wait(); log.Close(); close(done) }()
	return nil
}

// URL is a multi-host connection string over every node with
// target_session_attrs=read-write: the client connects to whichever node
// is the primary now, the way the README recommends connecting to a
// Patroni cluster without a proxy.
func (p *Patroni) URL() string {
	hosts := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.pgPort)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
}

// NodeURL is a connection string to node i alone.
func (p *Patroni) NodeURL(i int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", p.nodes[i].pgPort)
}

// Nodes is the number of nodes.
func (p *Patroni) Nodes() int { return len(p.nodes) }

// patroniStatus is the part of GET /patroni a test reads.
type patroniStatus struct {
	State string `json:"state"`
	Role  string `json:"role"`
}

func (p *Patroni) status(i int) (patroniStatus, error) {
	var s patroniStatus
	resp, err := p.http.Get(fmt.Sprintf("http://127.0.0.1:%d/patroni", p.nodes[i].rest))
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&s)
	return s, err
}

// Leader returns the index of the node that is the running primary, or
// -1 when none is.
func (p *Patroni) Leader() int {
	if ps := p.Primaries(); len(ps) > 0 {
		return ps[0]
	}
	return -1
}

// Primaries returns the indexes of the nodes that say they run as a
// primary: two at once is a split brain.
func (p *Patroni) Primaries() []int {
	var ps []int
	for i := range p.nodes {
		if s, err := p.status(i); err == nil && s.State == "running" && (s.Role == "master" || s.Role == "primary") {
			ps = append(ps, i)
		}
	}
	return ps
}

// WaitLeader waits at most d for a running primary other than not and
// returns its index.
func (p *Patroni) WaitLeader(ctx context.Context, d time.Duration, not ...int) (int, error) {
	deadline := time.Now().Add(d)
	for {
		for _, l := range p.Primaries() {
			if !slices.Contains(not, l) {
				return l, nil
			}
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("fault: patroni: no new leader within %s\n%s", d, p.Logs())
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitHealthy waits at most d until every node that is not stopped runs,
// one as the primary and, in synchronous mode, one as the synchronous
// standby (GET /sync answers 200).
func (p *Patroni) WaitHealthy(ctx context.Context, d time.Duration) error {
	return p.waitHealthy(ctx, d, nil)
}

// waitHealthy is WaitHealthy that also ends, with an error, once broken
// (when not nil) holds for a node.
func (p *Patroni) waitHealthy(ctx context.Context, d time.Duration, broken func(*patroniNode) bool) error {
	deadline := time.Now().Add(d)
	for {
		if p.healthy() {
			return nil
		}
		if i := slices.IndexFunc(p.nodes, func(n *patroniNode) bool { return broken != nil && broken(n) }); i >= 0 {
			return fmt.Errorf("fault: patroni: %s cannot start\n%s", p.nodes[i].name, p.Logs())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fault: patroni: cluster not healthy within %s\n%s", d, p.Logs())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (p *Patroni) healthy() bool {
	leaders, syncs := 0, 0
	for i, n := range p.nodes {
		p.mu.Lock()
		stopped := n.stopped
		p.mu.Unlock()
		if stopped {
			continue
		}
		s, err := p.status(i)
		if err != nil || s.State != "running" {
			return false
		}
		if s.Role == "master" || s.Role == "primary" {
			leaders++
		}
		if p.sync {
			if resp, err := p.http.Get(fmt.Sprintf("http://127.0.0.1:%d/sync", n.rest)); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					syncs++
				}
			}
		}
	}
	return leaders == 1 && (!p.sync || syncs >= 1)
}

// Kill kills node i as a power loss would: Patroni and its PostgreSQL
// processes, with SIGKILL at once. [Patroni.Restart] brings it back as a
// replica of whoever leads then.
func (p *Patroni) Kill(i int) error {
	n := p.nodes[i]
	p.mu.Lock()
	cmd, done := n.cmd, n.done
	n.stopped = true
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return fmt.Errorf("fault: patroni: %s is not running", n.name)
	}
	// PostgreSQL runs in Patroni's process group; its postmaster.pid says
	// which process to stop first so that no child is forked meanwhile.
	if b, err := os.ReadFile(filepath.Join(p.dir, n.name, "postmaster.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])); err == nil {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			for _, k := range children(pid) {
				_ = syscall.Kill(k, syscall.SIGKILL)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("fault: patroni: %s did not die", n.name)
	}
	return nil
}

// Restart starts node i again after [Patroni.Kill].
func (p *Patroni) Restart(i int) error {
	// Leftover processes of the killed node (a PostgreSQL child that was
	// re-parented) would hold its data directory.
	if b, err := os.ReadFile(filepath.Join(p.dir, p.nodes[i].name, "postmaster.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])); err == nil && alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return p.startNode(p.nodes[i])
}

// FreezeReplication cuts the leader off from its replicas: the proxy
// the other nodes replicate through drops everything, so they receive
// nothing more, yet answer queries and Patroni counts them healthy. With
// synchronous_mode the leader's commits then wait; without it they are
// acknowledged on the leader alone. thaw heals the proxy.
func (p *Patroni) FreezeReplication() (thaw func(), err error) {
	leader := p.Leader()
	if leader < 0 {
		return nil, errors.New("fault: patroni: freeze replication: no leader")
	}
	return p.nodes[leader].repl.Blackhole()
}

// CutFromDCS cuts node i off from etcd (its proxy drops everything) and
// returns the heal.
func (p *Patroni) CutFromDCS(i int) (heal func(), err error) {
	return p.nodes[i].dcs.Blackhole()
}

// Switchover asks the cluster to move the leadership from the current
// leader to another healthy node, as an operator does for maintenance,
// and returns the new leader's index.
func (p *Patroni) Switchover(ctx context.Context) (int, error) {
	from := p.Leader()
	if from < 0 {
		return -1, errors.New("fault: patroni: switchover: no leader")
	}
	body := fmt.Sprintf(`{"leader":%q}`, p.nodes[from].name)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/switchover", p.nodes[from].rest), strings.NewReader(body))
	if err != nil {
		return -1, err
	}
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Timeout: 60 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return -1, fmt.Errorf("fault: patroni: switchover: %w", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return -1, fmt.Errorf("fault: patroni: switchover: %s: %s", resp.Status, b)
	}
	return p.WaitLeader(ctx, 60*time.Second, from)
}

// Logs returns Patroni's own recent lines of every node (its decisions:
// promotions, demotions, errors), for a failure's message.
func (p *Patroni) Logs() string {
	var b strings.Builder
	for _, n := range p.nodes {
		data, _ := os.ReadFile(filepath.Join(p.dir, n.name+".log"))
		var lines []string
		for _, l := range strings.Split(string(data), "\n") {
			if strings.Contains(l, ": no action.") || strings.Contains(l, "Lock owner:") {
				continue // the once-a-loop heartbeat
			}
			if strings.Contains(l, " INFO: ") || strings.Contains(l, " WARNING: ") || strings.Contains(l, " ERROR: ") {
				lines = append(lines, l)
			}
		}
		fmt.Fprintf(&b, "--- %s (Patroni, last lines):\n%s\n", n.name, strings.Join(lines[max(0, len(lines)-25):], "\n"))
	}
	return b.String()
}

// Close stops every process and removes the directory.
func (p *Patroni) Close() {
	for _, n := range p.nodes {
		p.mu.Lock()
		cmd, stopped := n.cmd, n.stopped
		p.mu.Unlock()
		if cmd != nil && !stopped {
			_ = p.Kill(slices.Index(p.nodes, n))
		}
		for _, px := range []*Proxy{n.dcs, n.repl} {
			if px != nil {
				px.Close()
			}
		}
	}
	if p.etcd != nil && p.etcd.Process != nil {
		_ = syscall.Kill(-p.etcd.Process.Pid, syscall.SIGKILL)
	}
	os.RemoveAll(p.dir)
}
