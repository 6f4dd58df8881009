package redistest

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Cluster is a Redis Cluster of redis-server processes on loopback ports:
// masters with their replicas, each node a Server with its own directory.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts masters × (1 + replicas) cluster-enabled nodes, joins
// them with `redis-cli --cluster create`, and waits until every node reports
// cluster_state:ok. The nodes are stopped when the test ends. Node timeout
// is 1 s, so a killed master's replica takes over within a few seconds.
func StartCluster(t testing.TB, masters, replicas int, opts ...Option) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: redis-cli not found on PATH (%v): run `make deps` or `apt-get install redis-tools`", err)
	}
	c := &Cluster{}
	n := masters * (1 + replicas)
	for range n {
		args := WithArgs("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
			"--repl-diskless-sync-delay", "0")
		c.Nodes = append(c.Nodes, startClusterNode(t, append([]Option{args}, opts...)))
	}
	create := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		create = append(create, s.Addr())
	}
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := exec.Command(cli, create...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(t, 30*time.Second)
	return c
}

// startClusterNode starts a node whose cluster bus port (port + 10000) is
// valid: Start retries on another port when redis-server cannot bind.
func startClusterNode(t testing.TB, opts []Option) *Server {
	t.Helper()
	for range 10 {
		s := Start(t, opts...)
		if p, _ := strconv.Atoi(s.Addr()[strings.LastIndexByte(s.Addr(), ':')+1:]); p+10000 <= 65535 {
			return s
		}
		s.Stop()
	}
	t.Fatal("redistest: no port with a free cluster bus port")
	return nil
}

// Addrs are the nodes' addresses.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.Nodes {
		a = append(a, s.Addr())
	}
	return a
}

// URL is a redis:// URL naming every node as a seed (go-redis' cluster URL
// form: the first node, then addr= parameters).
func (c *Cluster) URL() string {
	a := c.Addrs()
	u := "redis://" + a[0]
	for i, x := range a[1:] {
		if i == 0 {
			u += "?addr=" + x
		} else {
			u += "&addr=" + x
		}
	}
	return u
}

// WaitHealthy waits until every live node reports cluster_state:ok, every
// slot is served by a master and every replica is in sync with its master.
func (c *Cluster) WaitHealthy(t testing.TB, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if c.healthy() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: cluster not healthy after %v", limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) healthy() bool {
	for _, s := range c.Nodes {
		if !s.alive() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.conf.password, DialTimeout: time.Second, ReadTimeout: time.Second})
		info, err := cl.ClusterInfo(context.Background()).Result()
		repl, rerr := cl.Info(context.Background(), "replication").Result()
		cl.Close()
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return false
		}
		// A replica that has not synced yet could not take over.
		if rerr != nil || strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return false
		}
	}
	return true
}

// MasterFor returns the node that serves key's slot now.
func (c *Cluster) MasterFor(t testing.TB, key string) *Server {
	t.Helper()
	for _, s := range c.Nodes {
		if !s.alive() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.conf.password})
		slot, err := cl.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			cl.Close()
			continue
		}
		slots, err := cl.ClusterSlots(context.Background()).Result()
		cl.Close()
		if err != nil {
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				for _, n := range c.Nodes {
					if n.Addr() == r.Nodes[0].Addr {
						return n
					}
				}
			}
		}
	}
	t.Fatalf("redistest: no master found for %q", key)
	return nil
}

// alive reports whether the server process runs and is not paused.
func (s *Server) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.paused
}

// WaitPromoted waits until a node other than old serves key's slot and the
// cluster is healthy again: a replica has taken over from a killed master.
func (c *Cluster) WaitPromoted(t testing.TB, old *Server, key string, limit time.Duration) *Server {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if m := c.MasterFor(t, key); m != old && c.healthy() {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no replica took over %q within %v", key, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
