package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	goredislib "github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/core/driver"
)

// clusterMasters is the size of the --redis-cluster cluster: three masters,
// no replicas, so a killed master's slots stay down until it restarts (no
// failover) while the other two keep serving theirs
// (cluster-require-full-coverage no).
const clusterMasters = 3

// clusterNodeArgs are the redis-server arguments of a cluster node, on top
// of the single server's (AOF, fsync always): its nodes.conf lives in its
// own directory, so a node restarted on the same port and directory rejoins
// with its ID and slots.
var clusterNodeArgs = []string{
	"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
}

// startRedisCluster starts clusterMasters cluster-enabled redis-servers on
// free loopback ports (each with its cluster bus port, port + 10000, free
// too), joins them with `redis-cli --cluster create`, waits until every node
// reports cluster_state:ok and reads the slot map.
func (c *cluster) startRedisCluster(ctx context.Context, bin, cli string) error {
	for i := range clusterMasters {
		n := &redisServer{bin: bin, dir: filepath.Join(c.work, "redis-"+strconv.Itoa(i+1)), cluster: true}
		if err := os.Mkdir(n.dir, 0o755); err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
		var err error
		for attempt := 0; ; attempt++ {
			if n.port, err = freeClusterPort(); err == nil {
				err = n.start(ctx)
			}
			if err == nil || attempt == 4 || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.nodes {
		args = append(args, n.addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	logPath := filepath.Join(c.work, "redis-cli.log")
	out, err := exec.CommandContext(cctx, cli, args...).CombinedOutput()
	os.WriteFile(logPath, out, 0o644)
	if err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w (see %s)", err, logPath)
	}
	if err := waitFor(ctx, nil, 30*time.Second, c.clusterOK); err != nil {
		return fmt.Errorf("redis cluster: cluster_state:ok on every node: %w", err)
	}
	masters, err := clusterSlots(ctx, c.nodes[0].addr())
	if err != nil {
		return err
	}
	c.masters = masters
	return nil
}

// freeClusterPort returns a loopback port that was free a moment ago and
// whose cluster bus port (port + 10000) was too.
func freeClusterPort() (int, error) {
	for range 20 {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		if port+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", loopback(port+10000))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free loopback port with a free cluster bus port (port + 10000)")
}

// clusterOK reports whether every node answers CLUSTER INFO with
// cluster_state:ok and all 16384 slots served.
func (c *cluster) clusterOK() bool {
	for _, n := range c.nodes {
		rc := goredislib.NewClient(&goredislib.Options{Addr: n.addr(), DialTimeout: 300 * time.Millisecond,
			ReadTimeout: time.Second, MaxRetries: -1, DisableIdentity: true})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := rc.ClusterInfo(ctx).Result()
		cancel()
		rc.Close()
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return false
		}
	}
	return true
}

// clusterSlots reads the masters and their slots from the node at addr,
// ordered by their first slot.
func clusterSlots(ctx context.Context, addr string) ([]Master, error) {
	rc := goredislib.NewClient(&goredislib.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1, DisableIdentity: true})
	defer rc.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	slots, err := rc.ClusterSlots(cctx).Result()
	if err != nil {
		return nil, fmt.Errorf("redis cluster: CLUSTER SLOTS on %s: %w", addr, err)
	}
	var out []Master
	index := map[string]int{}
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			return nil, fmt.Errorf("redis cluster: slots %d-%d have no master", s.Start, s.End)
		}
		a := s.Nodes[0].Addr
		i, ok := index[a]
		if !ok {
			i = len(out)
			index[a] = i
			out = append(out, Master{Addr: a})
		}
		out[i].Slots = append(out[i].Slots, driver.SlotRange{Start: s.Start, End: s.End})
	}
	for _, m := range out {
		sort.Slice(m.Slots, func(i, j int) bool { return m.Slots[i].Start < m.Slots[j].Start })
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slots[0].Start < out[j].Slots[0].Start })
	return out, nil
}

// redisURL is the instances' --redis: the single server's URL, or the
// cluster's seed list in the redis://seed1?addr=seed2&addr=seed3 form.
func (c *cluster) redisURL() string {
	if c.redis != nil {
		return "redis://" + c.redis.addr() + "/0"
	}
	var b strings.Builder
	for i, n := range c.nodes {
		switch i {
		case 0:
			b.WriteString("redis://")
		case 1:
			b.WriteString("?addr=")
		default:
			b.WriteString("&addr=")
		}
		b.WriteString(n.addr())
	}
	return b.String()
}

// node returns the node listening on addr, or nil.
func (c *cluster) node(addr string) *redisServer {
	for _, n := range c.nodes {
		if n.addr() == addr {
			return n
		}
	}
	return nil
}

// victimKey is the storage key whose master --redis-cluster kills: the
// heavy token-bucket client's.
func victimKey() string { return driver.StorageKey(demoPrefix, "tb", "heavy") }

// clusterRun describes the cluster for the Record: its masters, the one
// serving victimKey, and each series' key and slot.
func (c *cluster) clusterRun(series []*Series) (*ClusterRun, error) {
	cr := &ClusterRun{Masters: c.masters, Keys: map[string]string{}, Slots: map[string]int{}}
	for _, s := range series {
		k := driver.StorageKey(demoPrefix, s.Route, s.Client)
		cr.Keys[s.Name()], cr.Slots[s.Name()] = k, driver.HashSlot(k)
	}
	cr.Killed = cr.MasterOf(driver.HashSlot(victimKey()))
	if cr.Killed < 0 || c.node(c.masters[cr.Killed].Addr) == nil {
		return nil, fmt.Errorf("redis cluster: no node of ours serves %s (slot %d): masters %v", victimKey(), driver.HashSlot(victimKey()), c.masters)
	}
	return cr, nil
}

// ClusterSummary returns the lines a --redis-cluster run adds to the
// summary: the masters, which one was killed, each key's decisions by mode
// while it was down, and the shards' breakers as /status showed them
// meanwhile. It returns nil for a run on one redis-server.
func (r *Record) ClusterSummary() []string {
	cr := r.Cluster
	if cr == nil || cr.Killed < 0 || cr.Killed >= len(cr.Masters) {
		return nil
	}
	var ms []string
	for _, m := range cr.Masters {
		ms = append(ms, m.Addr+" slots "+m.SlotsString())
	}
	killed := cr.Masters[cr.Killed]
	out := []string{
		fmt.Sprintf("redis cluster: %d masters, no replicas: %s", len(cr.Masters), strings.Join(ms, ", ")),
		fmt.Sprintf("killed master %s (slots %s), serving tb heavy's key %s (slot %d): SIGKILL at %.1fs, restarted at %.1fs",
			killed.Addr, killed.SlotsString(), victimKey(), driver.HashSlot(victimKey()), sec(r.KillAt), sec(r.RestartAt)),
		"decisions of the requests sent while it was down, by the mode each answer named:",
	}
	width := 0
	for _, s := range r.Series {
		width = max(width, len(s.Name()))
	}
	for _, s := range r.Series {
		slot := cr.Slots[s.Name()]
		where := "no shard"
		if i := cr.MasterOf(slot); i == cr.Killed {
			where = "killed shard " + cr.Masters[i].SlotsString()
		} else if i >= 0 {
			where = "healthy shard " + cr.Masters[i].SlotsString()
		}
		out = append(out, fmt.Sprintf("  %-*s  slot %5d  %s: %s", width, s.Name(), slot, where, formatCounts(s.OutageModes, "no decisions")))
	}
	var bs []string
	for i, m := range cr.Masters {
		name := m.SlotsString()
		if i == cr.Killed {
			name += " (killed)"
		}
		bs = append(bs, name+" "+formatCounts(cr.Breakers[m.SlotsString()], "not seen"))
	}
	out = append(out, "shard breakers in /status while it was down (instances × polls): "+strings.Join(bs, "; "))
	return out
}

// formatCounts returns "redis 250, local 3", the largest count first, or
// none when there is nothing to count.
func formatCounts(m map[string]int, none string) string {
	type kv struct {
		k string
		v int
	}
	var kvs []kv
	for k, v := range m {
		kvs = append(kvs, kv{k, v})
	}
	if len(kvs) == 0 {
		return none
	}
	sort.Slice(kvs, func(i, j int) bool {
		if kvs[i].v != kvs[j].v {
			return kvs[i].v > kvs[j].v
		}
		return kvs[i].k < kvs[j].k
	})
	parts := make([]string, len(kvs))
	for i, x := range kvs {
		parts[i] = x.k + " " + strconv.Itoa(x.v)
	}
	return strings.Join(parts, ", ")
}
