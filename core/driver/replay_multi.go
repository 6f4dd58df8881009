package driver

import (
	"strconv"
)

// A MultiReplayer is a Replayer that can apply several batches in one
// script call: one round trip and one script run for many keys, where
// ReplayCall costs one of each per key. The caller puts in one call only
// batches whose keys share a hash slot, so the call stays valid on Redis
// Cluster.
type MultiReplayer interface {
	Replayer
	// MultiReplayScript returns the script that runs the script of
	// ReplayCall once per batch, in order, within one atomic call: the
	// script NewMultiReplayScript makes of the same source. MultiCall
	// builds its calls.
	MultiReplayScript() *Script
}

// NewMultiReplayScript returns the script that applies several replay
// calls of the replay script src in one call. src runs unchanged, as the
// body of a function called once per batch with that batch's KEYS and ARGV,
// so each batch checks its own marker first and sets it last, as it would
// alone. Build its calls with MultiCall; its reply is read by SplitReply.
//
// A batch whose body replies with an error (redis.error_reply) gets a reply
// of no integers and the batches after it still run; a Redis error raised
// inside the body (redis.call failing) ends the whole call with that error,
// leaving the batches before it applied and marked, those after it not
// run.
func NewMultiReplayScript(name, src string) *Script {
	return NewScript(name, "local function replay(KEYS, ARGV)\n"+src+"\nend\n"+multiTail, nil)
}

// multiTail is the loop of a multi-batch replay script.
//
// ARGV[1]  n, the number of batches
// ARGV[2i], ARGV[2i+1]  for batch i (1..n): its number of KEYS and of ARGV
// ARGV[2n+2], ...  every batch's ARGV, batch after batch; KEYS likewise
//
// Reply: for each batch, its reply's length and then its reply; a length
// of -1 (and nothing after it) for a batch whose replay replied an error.
const multiTail = `-- holdfast multi-batch replay (see core.NewMultiReplayScript)
local n = tonumber(ARGV[1])
local out = {}
-- One KEYS and one ARGV table for every batch, refilled: replay keeps
-- neither.
local keys, args = {}, {}
local k, a = 0, 2 * n + 1
for i = 1, n do
  local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  for j = 1, nk do
    keys[j] = KEYS[k + j]
  end
  for j = nk + 1, #keys do
    keys[j] = nil
  end
  for j = 1, na do
    args[j] = ARGV[a + j]
  end
  for j = #args, na + 1, -1 do
    args[j] = nil
  end
  k, a = k + nk, a + na
  local r = replay(keys, args)
  if type(r) == 'table' and r.err then
    out[#out + 1] = -1
  else
    out[#out + 1] = #r
    for j = 1, #r do
      out[#out + 1] = r[j]
    end
  end
end
return out
`

// MultiCall returns the call of the multi-batch script s that applies
// calls, each a call of the replay script s was made from, in order.
func MultiCall(s *Script, calls []Call) Call {
	nk, na := 0, 0
	for _, c := range calls {
		nk, na = nk+len(c.Keys), na+len(c.Args)
	}
	keys := make([]string, 0, nk)
	args := make([]string, 0, 1+2*len(calls)+na)
	args = append(args, strconv.Itoa(len(calls)))
	for _, c := range calls {
		keys = append(keys, c.Keys...)
		args = append(args, strconv.Itoa(len(c.Keys)), strconv.Itoa(len(c.Args)))
	}
	for _, c := range calls {
		args = append(args, c.Args...)
	}
	return Call{Script: s, Keys: keys, Args: args}
}

// SplitReply splits the reply of a MultiCall of n calls into each call's
// reply; a nil reply is a call whose replay replied an error (nothing is
// known of what it wrote: send it again alone to learn the error). ok is
// false when reply is not the reply of n calls.
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
