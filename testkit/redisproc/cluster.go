package redisproc

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds how long a new cluster may take to agree on its
// topology.
const clusterTimeout = 30 * time.Second

// Pair starts a primary and a replica of it, and waits until the replica's
// link to the primary is up.
func Pair(t TB) (primary, replica *Server) {
	t.Helper()
	primary = Start(t, Options{})
	replica = Start(t, Options{ReplicaOf: primary.Addr()})
	if err := replica.WaitLinked(context.Background(), clusterTimeout); err != nil {
		t.Fatalf("%v", err)
	}
	return primary, replica
}

// WaitLinked waits until s, a replica, reports its link to its primary up
// (INFO replication: master_link_status:up), for at most timeout.
func (s *Server) WaitLinked(ctx context.Context, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	err := waitFor(ctx, timeout, func(ctx context.Context) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replica link not up:\n%s", info)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisproc: replica %s: %w", s.Addr(), err)
	}
	return nil
}

// Cluster starts a Redis Cluster of n masters (no replicas) with the 16384
// slots split evenly, waits until every node reports cluster_state:ok and
// knows every slot, and returns the nodes' addresses.
func Cluster(t TB, n int) []string {
	t.Helper()
	nodes := StartCluster(t, n)
	addrs := make([]string, len(nodes))
	for i, s := range nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// StartCluster is [Cluster] returning the servers, so a test can kill,
// pause or restart one node.
func StartCluster(t TB, n int) []*Server {
	t.Helper()
	if n < 1 {
		t.Fatalf("redisproc: cluster of %d nodes", n)
	}
	nodes := make([]*Server, n)
	clients := make([]*redis.Client, n)
	for i := range nodes {
		nodes[i] = Start(t, Options{Cluster: true})
		clients[i] = redis.NewClient(&redis.Options{Addr: nodes[i].Addr(), MaxRetries: -1})
		defer clients[i].Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	const slots = 16384
	for i, c := range clients {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		// Distinct config epochs, as redis-cli --cluster create sets them, so
		// the nodes do not have to resolve epoch collisions first.
		if err := c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			t.Fatalf("redisproc: cluster set-config-epoch on %s: %v", nodes[i].Addr(), err)
		}
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("redisproc: cluster addslotsrange %d %d on %s: %v", lo, hi, nodes[i].Addr(), err)
		}
	}
	for i := 1; i < n; i++ {
		if err := clients[0].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(nodes[i].Port())).Err(); err != nil {
			t.Fatalf("redisproc: cluster meet %s: %v", nodes[i].Addr(), err)
		}
	}
	err := waitFor(ctx, clusterTimeout, func(ctx context.Context) error {
		for i, c := range clients {
			if err := clusterReady(ctx, c, n); err != nil {
				return fmt.Errorf("%s: %w", nodes[i].Addr(), err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redisproc: cluster not ready: %v", err)
	}
	return nodes
}

// clusterReady checks that c sees a healthy cluster of n masters covering
// every slot.
func clusterReady(ctx context.Context, c *redis.Client, n int) error {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	for _, want := range []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		"cluster_known_nodes:" + strconv.Itoa(n),
	} {
		if !strings.Contains(info, want+"\r\n") && !strings.HasSuffix(strings.TrimSpace(info), want) {
			return fmt.Errorf("want %s in:\n%s", want, info)
		}
	}
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return err
	}
	withSlots := 0
	for _, sh := range shards {
		if len(sh.Slots) > 0 {
			withSlots++
		}
	}
	if withSlots != n {
		return fmt.Errorf("CLUSTER SHARDS lists %d shards with slots, want %d", withSlots, n)
	}
	return nil
}
