package driver

import "strconv"

// Many is a script that makes several decisions on one key in one call:
// the decisions of a decision script s (NewDecisionScript) that arrive
// while others of s on that key are in flight. A store may send them
// together in one call of s's Many (s.WithMany gives it; the Redis stores
// do, through pipeline.Decisions): one EVALSHA, one read and one write of
// the key for all of them, where each would pay its own, so a hot key's
// concurrent callers share a round trip and a fraction of the Redis time. The
// decisions are made in order, at one instant of Redis time, each as s
// would make it alone at that instant.
//
// Call layout:
//
//	KEYS   the decisions' keys (they are the same for all)
//	ARGV   Shared arguments, equal in every decision's call of s; then
//	       for each decision its Each arguments, which follow the shared
//	       ones in its call of s, and its deadline: its DeadlineArg, or
//	       "" when it has none
//
// Reply: for each decision, in order, ManyStride integers: 0 and its
// reply as s gives it; or ManyStale and five zeros when its deadline had
// passed, and it was not decided (the guard's STALE). SplitMany reads it.
// An error reply is the error of every decision: the script must then
// have written nothing.
//
// NewMany makes one from the algorithm's Lua, which sees what every Many
// shares (manyHead): the call's Redis time as now and the reply, out;
// LuaManyHelpers has costs_ok and decide_each, which keeps the reply's
// layout, for a source that starts with it.
type Many struct {
	Script       *Script
	Shared, Each int
	// Keys makes several keys' decisions in one call: for each key in
	// turn, its decisions as Script makes them (see Keys' layout, at
	// NewMany).
	Keys *Script
}

// ManyStride is the integers of one decision in a Many reply, and
// ManyStale the status of one refused at its deadline.
const (
	ManyStride = 1 + ReplyLen
	ManyStale  = 1
	// ManyAlone is the status, in a Keys reply, of a decision whose key's
	// decisions failed in that call and wrote nothing (an error reply of
	// the key's Many, or an error of a command on the key: WRONGTYPE):
	// the caller sends them again on their own, to learn their error.
	ManyAlone = 2
)

// NewMany returns the Many named name whose decisions take shared and
// each arguments, made of src: Lua that defines
//
//	local function one(key, first, last)
//
// which makes, on key, the decisions whose arguments lie in ARGV from
// first to last: the first's Each arguments start at first, each next
// decision's EACH + 1 after the one before, and the last decision's
// deadline is ARGV[last]. It appends each decision's reply to the call's
// reply, in order (out and o, in the layout decide_each of
// LuaManyHelpers keeps), and returns nothing; or it returns
// an error reply, having written nothing. The shared arguments are
// ARGV[1] to ARGV[FIRST - 1] in every call; src may read them once,
// outside one. Its functions are made once a call, whatever the number
// of keys: a call pays for a closure once, not once a key.
//
// A Many call runs one(KEYS[1], FIRST, #ARGV). Its Keys script, named
// name + "_keys", runs one for each of several keys, at one instant of
// Redis time:
//
//	KEYS   the keys, in the order their decisions are made; a key may
//	       come more than once
//	ARGV   Shared arguments, equal in every decision's call; then for
//	       each key the number n of its decisions and, for each, its Each
//	       arguments and its deadline, as in a Many call
//
// Reply: for each key in order, for each of its decisions, ManyStride
// integers as in a Many reply; or, when the key's decisions failed (an
// error reply of one, or a command's error, such as WRONGTYPE),
// ManyAlone and five zeros for each of them. one writes nothing before
// it fails (a Many's contract), so that a caller may send them again on
// their own to learn the error. An error reply is the error of every
// decision (the call was not run: NOSCRIPT, OOM, a deadline). All keys
// must be in one hash slot on a cluster.
func NewMany(name, src string, shared, each int) *Many {
	head := decisionShebang + "local FIRST, EACH = " + strconv.Itoa(shared+1) + ", " + strconv.Itoa(each) + "\n" + manyHead + src + "\n"
	return &Many{
		Script: NewScript(name, head+manyOne, nil),
		Shared: shared, Each: each,
		Keys: NewScript(name+"_keys", head+keysLoop, nil),
	}
}

// manyHead is what every Many's source sees: the call's time, read once
// for every decision of the call, as now; the reply, out, and the number
// of its integers, o.
const manyHead = `-- holdfast: decisions on one key or several (driver.NewMany)
local now
do
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local out, o = {}, 0
`

// LuaManyHelpers is Lua a Many's source may start with: costs_ok, the
// check of the costs, and decide_each, which appends each decision's
// reply to out in the reply's layout. A source that decides in its own
// loop, in that layout, leaves it out: every function a call makes is
// Redis time it pays.
const LuaManyHelpers = `-- costs_ok reports whether the cost of every decision from first to last,
-- its first argument, is an integer in 1..max.
local function costs_ok(max, first, last)
  for i = first, last, EACH + 1 do
    local n = tonumber(ARGV[i])
    if not n or n < 1 or n > max then
      return false
    end
  end
  return true
end

-- decide_each calls decide(i), i a decision's first argument, for each
-- decision from first to last in order whose deadline has not passed at
-- now, and appends to out 0 and the five integers decide returned; or,
-- for one past its deadline (stale, not decided), 1 and five zeros. 64
-- is '@'.
local function decide_each(first, last, decide)
  for i = first, last, EACH + 1 do
    local d = ARGV[i + EACH]
    if d ~= '' and string.byte(d, 1) == 64 and now > tonumber(string.sub(d, 2)) then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 1, 0, 0, 0, 0, 0
    else
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, decide(i)
    end
    o = o + 6
  end
end

`

// manyOne is the body of a Many script, after the source: its one key's
// decisions.
const manyOne = `local err = one(KEYS[1], FIRST, #ARGV)
if err then
  return err
end
return out
`

// keysLoop is the body of a Keys script, after the source: it calls one
// for each key with that key's decisions, in the ARGV of the call itself
// (nothing is copied). A key's failure, an error reply or a command's
// error (pcall), or a reply of another length, fails that key's
// decisions alone (ManyAlone, 2).
const keysLoop = `local p, stride = FIRST, EACH + 1
for k = 1, #KEYS do
  local n = tonumber(ARGV[p])
  if not n or n < 1 or p + n * stride > #ARGV then
    return redis.error_reply('ERR holdfast: bad arguments of a call of several keys')
  end
  local start = o
  local ok, err = pcall(one, KEYS[k], p + 1, p + n * stride)
  if not ok or err or o ~= start + n * 6 then
    o = start
    for i = 1, n do
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 2, 0, 0, 0, 0, 0
      o = o + 6
    end
  end
  p = p + 1 + n * stride
end
if p <= #ARGV then
  return redis.error_reply('ERR holdfast: bad arguments of a call of several keys')
end
return out
`

// SplitMany splits the reply of a Many call of n decisions into each
// one's reply (nil for a decision refused at its deadline); ok is false
// when reply is not the reply of n decisions.
func SplitMany(reply []int64, n int) (replies [][]int64, ok bool) {
	if len(reply) != n*ManyStride {
		return nil, false
	}
	replies = make([][]int64, n)
	for i := range n {
		r := reply[i*ManyStride : (i+1)*ManyStride : (i+1)*ManyStride]
		switch r[0] {
		case 0:
			replies[i] = r[1:]
		case ManyStale:
		default:
			return nil, false
		}
	}
	return replies, true
}

// WithMany gives decision script s its Many, m, and returns s. It is
// called once, where s is made.
func (s *Script) WithMany(m *Many) *Script {
	s.many = m
	return s
}

// Many returns s's Many, or nil.
func (s *Script) Many() *Many { return s.many }

// Fits reports whether a call of the Many's decision script with args
// can be one of its decisions: it has the Shared and Each arguments and
// nothing else but a DeadlineArg.
func (m *Many) Fits(args []string) bool {
	return len(TrimDeadline(args)) == m.Shared+m.Each
}

// SameShared reports whether two calls' shared arguments are equal.
func (m *Many) SameShared(a, b []string) bool {
	for i := range m.Shared {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// AppendDecision appends the arguments of one decision, a call of the
// decision script with args, to those of a Many call.
func (m *Many) AppendDecision(out, args []string) []string {
	d := ""
	if t := TrimDeadline(args); len(t) < len(args) {
		d = args[len(t)]
	}
	out = append(out, args[m.Shared:m.Shared+m.Each]...)
	return append(out, d)
}
