package driver

import (
	"strconv"
	"strings"
	"time"
)

// A Replayer is an Algorithm whose grants, made locally during an outage,
// can be folded back into the store exactly once.
//
// Its replay script is a body that NewReplayScript wraps: the
// wrapper applies several batches in one call, each batch's body once,
// and keeps the markers that make each batch count once (see
// NewReplayScript). The body does the algorithm's own work on one key and
// nothing else.
type Replayer interface {
	Algorithm
	// ReplayScript returns the algorithm's replay script:
	// NewReplayScript of its body.
	ReplayScript() *Script
	// ReplayArgs appends batch b's arguments for the body to args and
	// returns the extended slice.
	ReplayArgs(args []string, b *Batch, o ReplayOptions) []string
	// ReplaySharedArgs appends the arguments that every batch of policy p
	// shares (the body's shared table) to args and returns the extended
	// slice: a call carries them once for all its batches.
	ReplaySharedArgs(args []string, p Policy, o ReplayOptions) []string
	// Coalesces reports whether grants of one key may be logged as one
	// grant of their summed cost at the latest of their times: true when
	// charging a grant later never counts it less (a token bucket refills
	// less), false when each grant must keep its own time or id (a sliding
	// log).
	Coalesces() bool
	// Outdated reports whether a grant of policy p made at store time at
	// (µs) no longer counts at now: the replay would skip it, so a full
	// outage log may drop it.
	Outdated(p Policy, at, now int64) bool
}

// ReplayOptions are what a replay's arguments may depend on besides the
// batch; reconcile chooses them.
type ReplayOptions struct {
	// MergeWindow is how long an algorithm may merge the batches of one
	// recovery (the token bucket's merge log) from the first of them.
	MergeWindow time.Duration
}

// NewReplayScript returns the replay script made of body, the Lua of
//
//	local function replay(key, i, n, fresh)
//
// which applies one batch to key: its own arguments are ARGV[i] to
// ARGV[i+n-1], as Replayer.ReplayArgs wrote them, and the arguments of
// its policy (Replayer.ReplaySharedArgs, the same for every batch of the
// call) are in the table shared, each a number where it is a decimal,
// else its string. fresh is true when key did not exist when the call
// began and no earlier batch of the call has it: the body may skip
// reading it. It sees the call's Redis time in µs (one TIME for the whole
// call) as now, a number, and nowS, its decimal string (Lua's own number
// to string conversion keeps 14 digits, too few for it). It returns a
// table of at least two integers, the first 1; or redis.error_reply, and
// then it must have written nothing. In a call of several batches a Redis
// error raised inside it (redis.call failing) fails that batch alone; a
// call of one batch replies the batch's error, whether raised or replied.
//
// The script applies the batches of one call in order, after reading
// their markers, all fields of one hash, in one HMGET; a batch marked
// there before is not run again and replies {0, 0}. The batches applied
// are marked in one HSET at the end, and the hash's TTL set again, so a
// marker lives at least the TTL from its batch (a call of 8 batches or
// more also writes field "~", whose long value keeps a hash that will
// hold thousands of markers a hash table from the start). A call that
// fails before its end (Redis does not roll back) leaves its batches
// unmarked: they are applied again on retry, at worst counted twice,
// never lost. A call of several batches on distinct keys first asks, in
// one EXISTS, whether any of its keys exists; when none does (Redis
// restarted empty) every body runs fresh.
//
// Call layout (built by ReplayCall):
//
//	KEYS[1]   the marker hash; KEYS[1+b] batch b's key
//	ARGV[1]   the number of batches; ARGV[2] the marker TTL in ms;
//	ARGV[3]   "1" when the batches' keys are distinct, else "0";
//	ARGV[4]   the number of shared arguments, s, and ARGV[5..4+s] them
//	then for each batch: its marker field, its number of arguments, and
//	its arguments
//
// Reply: for each batch, its reply's length and then its reply; a length
// of -1 (and nothing after it) for a batch whose body failed: nothing is
// known of it but that it was not marked. SplitReply reads it.
//
// helpers are Lua put before the replay function (after LuaIDiv): the
// functions body calls, made once a call rather than once a batch.
func NewReplayScript(name, body string, helpers ...string) *Script {
	return NewScript(name, replayHead+strings.Join(helpers, "")+"local function replay(key, i, n, fresh)\n"+body+"\nend\n"+replayTail, nil)
}

// replayHead declares what a replay body sees besides its arguments.
const replayHead = `-- holdfast replay (see driver.NewReplayScript)
local now, nowS
local shared = {}
` + LuaIDiv

// replayTail is the loop of a replay script (see NewReplayScript).
const replayTail = `-- holdfast replay loop (see driver.NewReplayScript)
local nb = 0 + ARGV[1]
local p = 5 + ARGV[4]
for j = 5, p - 1 do
  shared[j - 4] = tonumber(ARGV[j]) or ARGV[j]
end
` + luaReadBatches + `local t = redis.call('TIME')
now = tonumber(t[1]) * 1000000 + tonumber(t[2])
nowS = string.format('%d', now)
` + luaNoneExists + `local fresh = none
local out, no, marks, nm = {}, 0, {}, 0
for b = 1, nb do
  if done[b] then
    out[no + 1], out[no + 2], out[no + 3] = 2, 0, 0
    no = no + 3
  else
    local ok, r = true, nil
    if nb == 1 then
      -- A lone batch's error is the call's: its caller learns it.
      r = replay(KEYS[2], first[1], count[1], false)
      if type(r) == 'table' and r.err then
        return r
      end
    else
      ok, r = pcall(replay, KEYS[1 + b], first[b], count[b], fresh)
    end
    if ok and type(r) == 'table' and not r.err then
      local l = #r
      out[no + 1] = l
      for j = 1, l do
        out[no + 1 + j] = r[j]
      end
      no = no + 1 + l
      marks[nm + 1], marks[nm + 2] = fields[b], '1'
      nm = nm + 2
    else
      no = no + 1
      out[no] = -1
    end
  end
end
` + luaMarkBatches + `return out
`

// luaReadBatches is the Lua that reads a replay call's batches (from
// ARGV[p], p set before it, for nb batches: each batch's marker field,
// its number of arguments and its arguments) into fields, first and count,
// and their markers into done, in one HMGET of the marker hash KEYS[1].
const luaReadBatches = `local fields, first, count = {}, {}, {}
for b = 1, nb do
  fields[b] = ARGV[p]
  local c = 0 + ARGV[p + 1]
  first[b], count[b] = p + 2, c
  p = p + 2 + c
end
local done = redis.call('HMGET', KEYS[1], unpack(fields))
`

// luaNoneExists is the Lua that sets none when a call of several batches
// on distinct keys (ARGV[3] "1") has no key that exists among those of its
// batches not marked before, asked in one EXISTS.
const luaNoneExists = `local none = false
if nb > 1 and ARGV[3] == '1' then
  local keys, nk = {}, 0
  for b = 1, nb do
    if not done[b] then
      nk = nk + 1
      keys[nk] = KEYS[1 + b]
    end
  end
  -- An ACL without EXISTS (older docs) only costs each batch its own
  -- read of its key.
  none = nk > 0 and redis.pcall('EXISTS', unpack(keys)) == 0
end
`

// luaMarkBatches is the Lua that marks the nm / 2 batches applied
// (marks: their fields, each followed by '1') in one HSET of the marker
// hash, and sets its TTL (ARGV[2] ms) again.
const luaMarkBatches = `if nm > 0 then
  if nb >= 8 then
    -- A call of many batches is a large replay, whose marker hash grows
    -- past what Redis keeps as a listpack (searched field by field); a
    -- value past hash-max-listpack-value (64 bytes) makes it a hash
    -- table at once.
    marks[nm + 1], marks[nm + 2] = '~', 'holdfast: a value past 64 bytes keeps this marker hash a hash table'
  end
  redis.call('HSET', KEYS[1], unpack(marks))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
`

// A ReplayBatch is one batch of a replay call: its key, its field in the
// marker hash and the body's arguments.
type ReplayBatch struct {
	Key, Field string
	Args       []string
}

// ReplayCall returns the call of replay script s that applies batches,
// in order, with markers in hash marker that live ttl; shared are the
// arguments all batches share (Replayer.ReplaySharedArgs of their
// policy).
func ReplayCall(s *Script, marker string, ttl time.Duration, shared []string, batches []ReplayBatch) Call {
	na := 4 + len(shared)
	for _, b := range batches {
		na += 2 + len(b.Args)
	}
	keys := make([]string, 0, 1+len(batches))
	args := make([]string, 0, na)
	keys = append(keys, marker)
	args = append(args, strconv.Itoa(len(batches)), strconv.FormatInt(max(ttl.Milliseconds(), 1), 10),
		distinctKeys(batches), strconv.Itoa(len(shared)))
	args = append(args, shared...)
	for _, b := range batches {
		keys = append(keys, b.Key)
		args = append(args, b.Field, strconv.Itoa(len(b.Args)))
		args = append(args, b.Args...)
	}
	return Call{Script: s, Keys: keys, Args: args}
}

// SplitReply splits the reply of a ReplayCall of n batches into each
// batch's reply; a nil reply is a batch whose body failed (send it again
// alone to learn its error). ok is false when reply is not the reply of n
// batches.
func SplitReply(reply []int64, n int) (replies [][]int64, ok bool) {
	replies = make([][]int64, n)
	for i := range n {
		if len(reply) == 0 {
			return nil, false
		}
		l := reply[0]
		reply = reply[1:]
		switch {
		case l == -1:
			continue
		case l < 0 || l > int64(len(reply)):
			return nil, false
		}
		replies[i], reply = reply[:l:l], reply[l:]
	}
	return replies, len(reply) == 0
}
