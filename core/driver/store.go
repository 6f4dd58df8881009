package driver

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
)

// A Store runs one algorithm step atomically. The Redis backends run the
// step's Lua script with EVALSHA (falling back to EVAL when the server lost
// its script cache); the memory backend runs the step's Go twin under a
// per-key lock.
//
// Contract for implementations:
//   - Run is safe for concurrent use.
//   - Run does not retry. A failed call returns an error and the portable
//     layer (Limiter, fallback) decides what to do. Connection-level errors and
//     deadlines are wrapped with ErrStoreUnavailable; a WRONGTYPE error with
//     ErrWrongType; a reply that is not an array of integers with
//     ErrMalformedReply.
//   - A call that fails after the request was written has an UNKNOWN outcome:
//     the step may have been applied. Callers must treat its spend as possibly
//     applied.
type Store interface {
	Run(ctx context.Context, s *Script, keys []string, args []string) ([]int64, error)
}

// A LocalFunc is the Go twin of a script: given the key's previous state (nil
// when the key holds nothing), the current time in microseconds and the
// script's ARGV, it returns the next state, the reply the script would return,
// and how long the key should live (0 deletes it). It must not retain args.
type LocalFunc func(prev any, nowMicros int64, args []string) (next any, reply []int64, ttlMicros int64, err error)

// A Script is one atomic algorithm step: Lua source for Redis and its Go twin
// for local stores. Create scripts with NewScript at package level.
type Script struct {
	name    string
	src     string
	sha     string
	local   LocalFunc
	guarded bool
	many    *Many // see WithMany
}

// NewScript returns a Script with the given name, Lua source and Go twin. The
// twin may be nil for Redis-only scripts such as reconciliation.
func NewScript(name, src string, local LocalFunc) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{name: name, src: src, sha: hex.EncodeToString(sum[:]), local: local}
}

// NewDecisionScript is NewScript for a decision script: one that spends
// quota. Its Lua source is preceded by the deadline guard: a caller may
// append DeadlineArg(d) as the last ARGV, with d the call's deadline in the
// store's clock, and a call that Redis runs after d (a frozen Redis
// resuming, a queue drained late) is refused without writing, with the
// error reply "STALE …". The guard removes that argument, so the script's
// own ARGV are unchanged; without it the script runs as it would alone.
// The script sees the time the guard read as NOW (see deadlineGuard).
// Stores that run the Go twin drop the argument (TrimDeadline).
//
// What stays unknown is a call that Redis ran before its deadline and whose
// reply was still on its way when the caller gave up: at most a reply's
// flight time, not the length of a freeze.
func NewDecisionScript(name, src string, local LocalFunc) *Script {
	s := NewScript(name, decisionShebang+deadlineGuard+src, local)
	s.guarded = true
	return s
}

// decisionShebang starts every decision script (NewDecisionScript, and
// NewMany's): "#!lua" without flags, Redis 7.0's declaration of a script
// that may write. Redis then checks such a script as one write command
// before it runs: past maxmemory it is refused whole with OOM (and on a
// read-only replica with READONLY, under a failed save with MISCONF). A
// script without it is checked at each write instead, and Redis lets a
// write that may grow memory through once an earlier write of the same
// script changed something: a sliding window decision, which trims the
// window (ZREMRANGEBYSCORE frees memory, so it is allowed past maxmemory)
// before it adds, was admitted through an OOM Redis whenever its trim
// removed a member and refused otherwise, so some instances kept deciding
// through Redis while the others had opened, a partial partition. Redis
// before 7.0 cannot run a script that starts with it.
const decisionShebang = "#!lua\n"

// deadlineGuard is the Lua that NewDecisionScript puts after
// decisionShebang. 64 is '@'.
//
// The guard leaves the Redis time it read in NOW (µs; nil when the call has
// no deadline), for the script to use instead of reading TIME again, one
// of the three commands of a token bucket decision.
const deadlineGuard = `-- holdfast deadline guard (see core.NewDecisionScript)
local NOW
do
  local d = ARGV[#ARGV]
  if d and string.byte(d, 1) == 64 then
    ARGV[#ARGV] = nil
    local t = redis.call('TIME')
    NOW = t[1] * 1000000 + t[2]
    if NOW > 0 + string.sub(d, 2) then
      return redis.error_reply('STALE holdfast: the call ran after its deadline')
    end
  end
end
`

// LuaIDiv is the Lua of idiv(a, b), floor(a / b) for integers, exact even
// where a / b rounds: the integer division every script that divides
// shares. Replay scripts have it (NewReplayScript); a decision script's
// source starts with it where it needs it.
const LuaIDiv = `-- idiv is floor(a / b) for integers, exact even where a / b rounds.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
`

// DeadlineArg is the last ARGV that asks a decision script's guard to
// refuse the call after deadline, in the store's clock in microseconds
// since the Unix epoch.
func DeadlineArg(deadline int64) string {
	return "@" + strconv.FormatInt(deadline, 10)
}

// TrimDeadline returns args without a trailing DeadlineArg.
func TrimDeadline(args []string) []string {
	if n := len(args); n > 0 && strings.HasPrefix(args[n-1], "@") {
		return args[:n-1]
	}
	return args
}

// Guarded reports whether s is a decision script with the deadline guard.
func (s *Script) Guarded() bool { return s.guarded }

// Name is the script's name, for logs and metrics.
func (s *Script) Name() string { return s.name }

// Source is the Lua source.
func (s *Script) Source() string { return s.src }

// SHA1 is the hex SHA-1 of the source, as EVALSHA wants it.
func (s *Script) SHA1() string { return s.sha }

// Local is the Go twin, or nil when the script has none.
func (s *Script) Local() LocalFunc { return s.local }

// Reply is the decoded reply of a decision script. Every decision script
// returns the same five integers, in this order.
type Reply struct {
	Allowed    bool
	Remaining  int64
	RetryAfter int64 // microseconds
	ResetAfter int64 // microseconds
	Now        int64 // the store's clock, microseconds since the Unix epoch
}

// ReplyLen is the number of integers a decision script returns.
const ReplyLen = 5

// ParseReply decodes a decision script's reply, checking its shape.
func ParseReply(r []int64) (Reply, error) {
	if len(r) != ReplyLen {
		return Reply{}, errorf(ErrMalformedReply, "decision reply has %d elements, want %d", len(r), ReplyLen)
	}
	if r[0] != 0 && r[0] != 1 {
		return Reply{}, errorf(ErrMalformedReply, "allowed flag is %d, want 0 or 1", r[0])
	}
	if r[2] < 0 || r[3] < 0 || r[4] <= 0 {
		return Reply{}, errorf(ErrMalformedReply, "negative duration or clock in reply %v", r)
	}
	return Reply{Allowed: r[0] == 1, Remaining: r[1], RetryAfter: r[2], ResetAfter: r[3], Now: r[4]}, nil
}

// Pinger is implemented by stores that can check their connection cheaply,
// like database/sql/driver.Pinger. The fallback layer's health probe uses it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// A Call is one script invocation of a pipeline.
type Call struct {
	Script *Script
	Keys   []string
	Args   []string
}

// A CallResult is the outcome of one Call: its reply or its error, mapped as
// Store.Run maps them.
type CallResult struct {
	Reply []int64
	Err   error
}

// Pipeliner is implemented by stores that can send many calls in one round
// trip (a Redis pipeline). Each call is atomic on its own; the calls are not
// atomic together, and a failure of one does not stop the others. Like Run,
// RunMany does not retry, except that a call the server refused with
// NOSCRIPT (not executed) may be sent again after loading the script.
type Pipeliner interface {
	RunMany(ctx context.Context, calls []Call) []CallResult
}
