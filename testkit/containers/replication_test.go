package containers_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"

	"github.com/oncekey/oncekey/testkit/containers"
)

// needDocker skips the test when no Docker daemon answers (or
// ONCEKEY_CONTAINERS=off), or fails it when ONCEKEY_CONTAINERS_REQUIRED=1
// (.ci/containers sets it, with CI=true: there a missing daemon is a
// failure, never a skip).
func needDocker(t *testing.T) {
	t.Helper()
	err := errors.New("ONCEKEY_CONTAINERS=off")
	if os.Getenv("ONCEKEY_CONTAINERS") != "off" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var cli *testcontainers.DockerClient
		if cli, err = testcontainers.NewDockerClientWithOpts(ctx); err == nil {
			cli.Close()
		}
	}
	if err == nil {
		return
	}
	if os.Getenv("ONCEKEY_CONTAINERS_REQUIRED") == "1" {
		t.Fatalf("ONCEKEY_CONTAINERS_REQUIRED=1 but no Docker daemon answers: %v", err)
	}
	t.Skipf("no Docker daemon answers: %v", err)
}

// newSet returns a Set configured by the environment, closed (every
// container removed) when the test ends.
func newSet(t *testing.T) *containers.Set {
	t.Helper()
	needDocker(t)
	o := containers.FromEnv()
	o.Log = testWriter{t}
	s := containers.New(o)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// eventually calls f until it returns nil or d passes, and fails the test
// with f's last error.
func eventually(t *testing.T, d time.Duration, what string, f func(ctx context.Context) error) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// A standby of a primary with synchronous_standby_names='*' is its
// synchronous standby: pg_stat_replication says sync, a commit on the
// primary is on the standby, a commit waits while the standby is
// disconnected, and the promoted standby has every acknowledged commit
// and accepts writes. Killed and started again, the standby streams again
// from its own data.
func TestPostgresStandby_SynchronousDisconnectPromote(t *testing.T) {
	s := newSet(t)
	ctx := t.Context()
	primary, err := s.NewPostgres(ctx, "synchronous_standby_names=*", "synchronous_commit=on")
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	standby, err := s.NewPostgresStandby(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	if standby.Addr() == primary.Addr() {
		t.Fatalf("the standby answers on the primary's address %s", primary.Addr())
	}

	p := connect(t, primary.URL())
	isSync := func(ctx context.Context) error {
		rows, err := p.Query(ctx, "SELECT application_name, state, sync_state FROM pg_stat_replication")
		if err != nil {
			return err
		}
		var got []string
		for rows.Next() {
			var app, state, sync string
			if err := rows.Scan(&app, &state, &sync); err != nil {
				return err
			}
			got = append(got, app+" "+state+" "+sync)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(got) != 1 || got[0] != "standby streaming sync" {
			return fmt.Errorf("pg_stat_replication on the primary: %q, want one standby streaming sync", got)
		}
		return nil
	}
	eventually(t, 30*time.Second, "synchronous standby", isSync)

	if _, err := p.Exec(ctx, "CREATE TABLE acked (n int)"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, "INSERT INTO acked VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	sb := connect(t, standby.URL())
	var rec bool
	if err := sb.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil || !rec {
		t.Fatalf("standby in recovery = %v, %v; want true", rec, err)
	}
	eventually(t, 10*time.Second, "row on the standby", func(ctx context.Context) error {
		var n int
		if err := sb.QueryRow(ctx, "SELECT count(*) FROM acked").Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("%d rows", n)
		}
		return nil
	})

	// Killed (SIGKILL through the container API) and started again: a
	// standby again, from its own data, synchronous again.
	if err := standby.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "synchronous standby after its restart", isSync)

	if err := standby.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	// Synchronous: with its standby gone, a commit on the primary does not
	// return.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	blocked := connect(t, primary.URL())
	_, err = blocked.Exec(wctx, "INSERT INTO acked VALUES (2)")
	cancel()
	if err == nil {
		t.Fatal("a commit on the primary returned with its synchronous standby disconnected")
	}

	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	np := connect(t, standby.URL())
	if err := np.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil || rec {
		t.Fatalf("promoted standby in recovery = %v, %v; want false", rec, err)
	}
	var n int
	if err := np.QueryRow(ctx, "SELECT count(*) FROM acked WHERE n = 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("acknowledged row on the promoted standby: %d, %v; want 1", n, err)
	}
	if _, err := np.Exec(ctx, "INSERT INTO acked VALUES (3)"); err != nil {
		t.Fatalf("write on the promoted standby: %v", err)
	}
}

// A replica has what its primary had before it attached and what is
// written after.
func TestRedisReplica_Replicates(t *testing.T) {
	s := newSet(t)
	ctx := t.Context()
	primary, err := s.NewRedis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	pc := redis.NewClient(&redis.Options{Addr: primary.Addr()})
	defer pc.Close()
	if err := pc.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	replica, err := s.NewRedisReplica(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	if err := pc.Set(ctx, "after", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer rc.Close()
	eventually(t, 10*time.Second, "keys on the replica", func(ctx context.Context) error {
		got, err := rc.MGet(ctx, "before", "after").Result()
		if err != nil {
			return err
		}
		if got[0] != "1" || got[1] != "2" {
			return fmt.Errorf("before, after = %v", got)
		}
		return nil
	})
}

// Three Sentinels promote the replica when the primary is killed
// (SIGKILL through the container API), and hand out its address, the one
// the host reaches it on.
func TestSentinel_PromotesReplica(t *testing.T) {
	s := newSet(t)
	if !containers.FromEnv().HostNetwork {
		if os.Getenv("ONCEKEY_CONTAINERS_REQUIRED") == "1" {
			t.Fatal("ONCEKEY_CONTAINERS_REQUIRED=1 but ONCEKEY_CONTAINERS_NETWORK is not host: Sentinels need it")
		}
		t.Skip("Sentinels need ONCEKEY_CONTAINERS_NETWORK=host (see TestSentinel_BridgeNetworkRefused)")
	}
	ctx := t.Context()
	primary, err := s.NewRedis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	replica, err := s.NewRedisReplica(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	pc := redis.NewClient(&redis.Options{Addr: primary.Addr()})
	defer pc.Close()
	if err := pc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := pc.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas, %v; want 1", n, err)
	}
	var sentinels []string
	for range 3 {
		sn, err := s.NewSentinel(ctx, primary, containers.SentinelOptions{Master: "m"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sn.Close)
		sentinels = append(sentinels, sn.Addr())
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinels[0]})
	defer sc.Close()
	master := func(ctx context.Context) (string, error) {
		a, err := sc.GetMasterAddrByName(ctx, "m").Result()
		if err != nil {
			return "", err
		}
		if len(a) != 2 {
			return "", fmt.Errorf("master address %q", a)
		}
		return net.JoinHostPort(a[0], a[1]), nil
	}
	// Each Sentinel knows the replica and the two others before the kill.
	eventually(t, 30*time.Second, "sentinels and replica discovered", func(ctx context.Context) error {
		for _, a := range sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: a})
			reps, err := c.Replicas(ctx, "m").Result()
			if err == nil && len(reps) != 1 {
				err = fmt.Errorf("sentinel %s knows %d replicas", a, len(reps))
			}
			var sns []map[string]string
			if err == nil {
				sns, err = c.Sentinels(ctx, "m").Result()
			}
			if err == nil && len(sns) != 2 {
				err = fmt.Errorf("sentinel %s knows %d other sentinels", a, len(sns))
			}
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if m, err := master(ctx); err != nil || m != primary.Addr() {
		t.Fatalf("master before the kill: %q, %v; want %s", m, err, primary.Addr())
	}
	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the sentinels promote the replica", func(ctx context.Context) error {
		m, err := master(ctx)
		if err == nil && m != replica.Addr() {
			err = fmt.Errorf("master %s, want the replica %s", m, replica.Addr())
		}
		return err
	})
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer rc.Close()
	eventually(t, 30*time.Second, "the promoted replica accepts writes", func(ctx context.Context) error {
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:master") {
			return errors.New("not role:master")
		}
		return rc.Set(ctx, "k2", "v2", 0).Err()
	})
	if v, err := rc.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("k on the promoted replica = %q, %v; want v", v, err)
	}
}

// On Docker's bridge network a Sentinel is refused before anything
// starts, with an error saying it needs the host network.
func TestSentinel_BridgeNetworkRefused(t *testing.T) {
	s := containers.New(containers.Options{HostNetwork: false, Log: testWriter{t}})
	defer s.Close()
	_, err := s.NewSentinel(t.Context(), nil, containers.SentinelOptions{Master: "m"})
	if !errors.Is(err, containers.ErrNeedsHostNetwork) || !strings.Contains(err.Error(), "ONCEKEY_CONTAINERS_NETWORK=host") {
		t.Fatalf("NewSentinel on the bridge network: %v; want ErrNeedsHostNetwork", err)
	}
}
