// Package redisproc starts and stops redis-server processes on free loopback
// ports for tests: standalone servers that can be killed, paused and
// restarted empty, a primary with a replica, and a Redis Cluster of n
// masters.
//
// Every process runs without persistence (no RDB, no AOF), so a restart
// comes back empty, the way a crashed cache node does. Every process is
// stopped in t.Cleanup; on Linux a process is also killed if the test binary
// dies first.
//
// The redis-server binary is $REDIS_SERVER when set, else the first
// redis-server on $PATH. When it is missing the test fails with CI=true (CI
// must never pass by skipping) and is skipped with the reason otherwise.
//
//	srv := redisproc.Start(t, redisproc.Options{})
//	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
//	srv.Kill()    // connections refused from now on
//	srv.Restart() // same port, empty
//
//	addrs := redisproc.Cluster(t, 3) // three masters, all 16384 slots assigned
//	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
package redisproc
