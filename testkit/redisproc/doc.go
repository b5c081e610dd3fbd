// Package redisproc starts and stops redis-server processes on free loopback
// ports: standalone servers that can be killed, paused and restarted empty,
// a primary with a replica, and a Redis Cluster of n masters. It is the one
// place the project manages redis-server processes, for the tests and for
// the chaos runner.
//
// Every process runs without persistence (no RDB, no AOF), so a restart
// comes back empty, the way a crashed cache node does. On Linux a process
// is also killed if the process that started it dies first.
//
// [New] returns errors and does not need a test; [Start], [Pair], [Cluster]
// and [StartCluster] take a [TB] (a *testing.T), stop their processes in
// t.Cleanup, and fail the test on an error.
//
// The redis-server binary is $REDIS_SERVER when set, else the first
// redis-server on $PATH. When it is missing, [New] returns [ErrNoBinary];
// a test fails with CI=true (CI must never pass by skipping) and is skipped
// with the reason otherwise.
//
//	srv := redisproc.Start(t, redisproc.Options{})
//	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
//	srv.Kill()              // connections refused from now on
//	err := srv.Restart()    // same port, empty
//
//	addrs := redisproc.Cluster(t, 3) // three masters, all 16384 slots assigned
//	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package redisproc
