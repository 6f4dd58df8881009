package cluster

import (
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// A Route is one limited path of the demo config.
type Route struct {
	// Name is the policy's name (tb, sw).
	Name string
	// Path is the limited route.
	Path string
	// Policy is the policy the instances enforce on it.
	Policy core.Policy
}

// quota is the route's algorithm as a driver.Quotaer: every algorithm a
// config can name is one.
func (r Route) quota() driver.Quotaer {
	q, _ := r.Policy.Algorithm().(driver.Quotaer)
	return q
}

// Allowance is the policy's long-run rate per second: its quota over the
// quota's window (a token bucket's refill rate, a window's limit ÷ length).
func (r Route) Allowance() float64 {
	units, w := r.quota().Quota(r.Policy)
	return float64(units) / w.Seconds()
}

// Bound is what one exact limiter admits at most to a client above the
// limit over a run of length d (DESIGN.md's invariant): token bucket
// capacity + rate × d, sliding window limit × (whole windows in d + 1).
func (r Route) Bound(d time.Duration) float64 {
	_, most := r.quota().Bound(r.Policy, d)
	return most
}

// Ideal is what one exact limiter admits to a client that asks above the
// limit all the time from the start of a run of length d: the bound for a
// token bucket; limit × ⌈d ÷ window⌉ for a sliding window, whose bound
// allows one more window for spans that straddle window starts.
func (r Route) Ideal(d time.Duration) float64 {
	ideal, _ := r.quota().Bound(r.Policy, d)
	return ideal
}

// Describe returns e.g. "token bucket 20 + 5/s" or "sliding window 20 per 2s".
func (r Route) Describe() string { return r.quota().Describe(r.Policy) }

// A Series is what one client saw on one route, per second of the run,
// counted at the client (through nginx) by the second its request was
// scheduled in.
type Series struct {
	// Route is the route's name.
	Route string
	// Client is the client's X-Client-ID: "heavy" or "gentle".
	Client string
	// Rate is the client's request rate per second.
	Rate float64
	// Heavy marks a client above its limit.
	Heavy bool
	// Admitted, Rejected and Errors count 200s, 429s and everything else
	// (transport errors, 4xx other than 429, 5xx) per second.
	Admitted, Rejected, Errors []int
	// ServerErrors counts the 5xx answers among Errors.
	ServerErrors []int
	// Local counts the admissions decided by a lease (mode local).
	Local []int
	// OutageModes counts the decisions (200 and 429 answers) of the
	// requests sent while Redis, or the killed master, was down, by the
	// mode each answer named (redis, local, fail_open, fail_closed).
	OutageModes map[string]int
}

// Name returns "route client", e.g. "tb heavy".
func (s *Series) Name() string { return s.Route + " " + s.Client }

// Total returns the sum of a per-second count.
func Total(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// Record is everything a cluster run measured: the input of the table, the
// report and the invariant checks.
type Record struct {
	// Backend is the Redis client the instances used.
	Backend string
	// Fault is what the outage did to Redis (--fault): kill, stop, oom or
	// readonly; "" means kill.
	Fault string
	// Duration is how long the load ran.
	Duration time.Duration
	// Routes are the limited routes.
	Routes []Route
	// Series are the clients' counts, route by route, heavy first.
	Series []*Series
	// Instances are the instances' IDs.
	Instances []string
	// Breakers holds, per second, each instance's breaker state as its
	// /status last showed it in that second ("?" when it did not answer).
	Breakers [][]string
	// Pending holds, per second, the instances' pending_log summed.
	Pending []int
	// RedisDown marks the seconds Redis was down for at least part of.
	RedisDown []bool
	// KillAt and RestartAt are when the fault was applied to Redis and
	// lifted (kill: when Redis was killed and restarted); a negative value
	// means it did not happen.
	KillAt, RestartAt time.Duration
	// ReconciledAt is when an instance first reported a reconciliation after
	// the restart; RecoveredAt when every breaker was closed again. Negative:
	// not seen.
	ReconciledAt, RecoveredAt time.Duration
	// Final is each instance's /status at the end of the run.
	Final []serve.Status
	// Cluster describes the Redis Cluster of a --redis-cluster run; nil
	// for one redis-server.
	Cluster *ClusterRun
}

// ClusterRun is what a run on Redis Cluster adds to its Record.
type ClusterRun struct {
	// Masters are the cluster's masters, as CLUSTER SLOTS showed them
	// before the load.
	Masters []Master
	// Killed is the index in Masters of the master that was killed: the one
	// serving the heavy token-bucket client's key.
	Killed int
	// Keys holds each series' storage key (by Series.Name), and Slots its
	// hash slot.
	Keys  map[string]string
	Slots map[string]int
	// Breakers counts, per shard (by its slots as /status shows them), the
	// breaker states the instances' /status showed while the master was
	// down: one count per instance per poll.
	Breakers map[string]map[string]int
}

// A Master is one Redis Cluster master and the slots it serves.
type Master struct {
	Addr  string
	Slots []driver.SlotRange
}

// SlotsString returns the master's slots as fallback's /status shows a
// shard's: "0-5460", ranges joined by commas.
func (m Master) SlotsString() string {
	parts := make([]string, len(m.Slots))
	for i, r := range m.Slots {
		parts[i] = strconv.Itoa(r.Start) + "-" + strconv.Itoa(r.End)
	}
	return strings.Join(parts, ",")
}

// Serves reports whether the master serves slot.
func (m Master) Serves(slot int) bool {
	for _, r := range m.Slots {
		if r.Start <= slot && slot <= r.End {
			return true
		}
	}
	return false
}

// MasterOf returns the index of the master serving slot, or -1.
func (c *ClusterRun) MasterOf(slot int) int {
	for i, m := range c.Masters {
		if m.Serves(slot) {
			return i
		}
	}
	return -1
}

// Seconds is the number of whole or partial seconds the load ran.
func (r *Record) Seconds() int {
	return int((r.Duration + time.Second - 1) / time.Second)
}

// Route returns the route named name.
func (r *Record) Route(name string) (Route, bool) {
	for _, rt := range r.Routes {
		if rt.Name == name {
			return rt, true
		}
	}
	return Route{}, false
}

// Heavy returns the series of the heavy clients.
func (r *Record) Heavy() []*Series {
	var out []*Series
	for _, s := range r.Series {
		if s.Heavy {
			out = append(out, s)
		}
	}
	return out
}
