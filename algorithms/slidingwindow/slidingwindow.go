// Package slidingwindow is the sliding window log algorithm: at most Limit
// units are admitted in any window of length Window, exactly. Every admitted
// unit is remembered with its admission time (in Redis, a sorted set whose
// members are unique request ids), so memory grows with the limit.
//
// The Lua script (slidingwindow.lua) and its Go twin (Decide) return
// identical answers.
package slidingwindow

import (
	_ "embed"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// Name is the algorithm's config name.
const Name = "sliding_window"

// MaxLimit bounds a sliding window's limit: every unit in the window is a
// sorted-set member in Redis, about 100 bytes each.
const MaxLimit = 1_000_000

//go:embed window.lua
var window string

//go:embed slidingwindow.lua
var source string

//go:embed many.lua
var manySource string

// script is the decision; peekScript the same source with PEEK set, the
// reply without the write (driver.Peeker); its Many is several
// decisions on one key (driver.Many): the policy's L and W shared, a cost
// and an id each.
var (
	script, peekScript = driver.NewDecisionScripts(Name, window+source, local, cloneState)
	_                  = script.WithMany(driver.NewMany(Name+"_many", driver.LuaManyHelpers+window+manySource, 2, 2))
)

// cloneState copies the state the memory store holds, for a peek.
func cloneState(prev any) any {
	if st, ok := prev.(*Log); ok {
		return &Log{At: slices.Clone(st.At)}
	}
	return prev
}

type algorithm struct{}

// Algorithm is the sliding window as a driver.Algorithm. It is also a
// driver.DirectAlgorithm.
var Algorithm driver.Algorithm = algorithm{}

var _ driver.DirectAlgorithm = algorithm{}

// Policy returns a sliding window policy named name that admits at most limit
// units in any window of length window.
func Policy(name string, limit int64, window time.Duration) (core.Policy, error) {
	return driver.NewPolicy(name, Algorithm, limit, window)
}

func (algorithm) Name() string           { return Name }
func (algorithm) Script() *driver.Script { return script }
func (algorithm) NeedsID() bool          { return true }

func (algorithm) Validate(limit int64, window time.Duration) error {
	if limit > MaxLimit {
		return driver.Errorf(core.ErrInvalidPolicy, "sliding window limit %d above %d", limit, MaxLimit)
	}
	if window < time.Millisecond {
		return driver.Errorf(core.ErrInvalidPolicy, "sliding window %v shorter than 1ms", window)
	}
	return nil
}

func (algorithm) Args(p core.Policy, cost int64, id string, nowMicros int64) []string {
	// Room for the optional now and the deadline a caller appends
	// (driver.DeadlineArg): one allocation per call.
	args := append(make([]string, 0, 6),
		strconv.FormatInt(p.Limit(), 10),
		strconv.FormatInt(int64(p.Interval()/time.Microsecond), 10),
		strconv.FormatInt(cost, 10),
		id,
	)
	if nowMicros > 0 {
		args = append(args, strconv.FormatInt(nowMicros, 10))
	}
	return args
}

// Log is a window's admitted units: their admission times in microseconds,
// in ascending order.
type Log struct {
	At []int64
}

// Size is the log's size in bytes, for memory accounting.
func (l *Log) Size() int64 { return 24 + 8*int64(cap(l.At)) }

// Trim drops the units at or before now - w: they have left the window.
func (l *Log) Trim(now, w int64) {
	i := sort.Search(len(l.At), func(i int) bool { return l.At[i] > now-w })
	if i > 0 {
		l.At = append(l.At[:0], l.At[i:]...)
	}
}

// Decide is the Go twin of slidingwindow.lua: it trims l, then admits n units
// at now if they fit under limit lim in window w (microseconds), appending
// them to l. It returns the script's reply.
func Decide(l *Log, now, lim, w, n int64) [driver.ReplyLen]int64 {
	l.Trim(now, w)
	count := int64(len(l.At))
	if count+n > lim {
		k := count + n - lim
		return [driver.ReplyLen]int64{0, max(lim-count, 0), l.At[k-1] + w - now, l.At[count-1] + w - now, now}
	}
	i := sort.Search(len(l.At), func(i int) bool { return l.At[i] > now })
	for range n {
		l.At = append(l.At, 0)
	}
	copy(l.At[i+int(n):], l.At[i:])
	for j := range n {
		l.At[i+int(j)] = now
	}
	return [driver.ReplyLen]int64{1, lim - count - n, 0, w, now}
}

// local adapts Decide to driver.LocalFunc for the memory store.
func local(prev any, now int64, args []string) (any, []int64, int64, error) {
	if len(args) < 4 || len(args) > 5 || args[3] == "" {
		return prev, nil, 0, driver.Errorf(core.ErrInvalidPolicy, "sliding window: bad arguments %q", args)
	}
	num := append([]string{args[0], args[1], args[2]}, args[4:]...)
	v, err := driver.ParseArgs(num, 3, 4)
	if err != nil {
		return prev, nil, 0, err
	}
	lim, w, n := v[0], v[1], v[2]
	if lim < 1 || w < 1 || n < 1 || n > lim {
		return prev, nil, 0, driver.Errorf(core.ErrInvalidPolicy, "sliding window: bad arguments %q", args)
	}
	if len(v) == 4 && v[3] > 0 {
		now = v[3]
	}
	next, r, ttl := step(prev, prev != nil, now, lim, w, n)
	return next, r[:], ttl, nil
}

// Step is the Go twin on typed arguments (driver.DirectAlgorithm): the
// decision local makes for ARGV Args(p, cost, id, 0), whatever the id (the
// twin keeps times, not ids).
func (algorithm) Step(p core.Policy, prev any, live bool, now, cost int64) (any, driver.Reply, int64) {
	next, r, ttl := step(prev, live, now, p.Limit(), int64(p.Interval()/time.Microsecond), cost)
	return next, driver.Reply{Allowed: r[0] == 1, Remaining: r[1], RetryAfter: r[2], ResetAfter: r[3], Now: r[4]}, ttl
}

// step decides on the *Log the memory store holds (prev, if live; an
// expired one is reused).
func step(prev any, live bool, now, lim, w, n int64) (any, [driver.ReplyLen]int64, int64) {
	l, _ := prev.(*Log)
	switch {
	case l == nil:
		l = &Log{}
	case !live:
		l.At = l.At[:0]
	}
	r := Decide(l, now, lim, w, n)
	if len(l.At) == 0 {
		return nil, r, 0
	}
	return l, r, max(l.At[len(l.At)-1]+w-now, 1)
}
