package driver

import (
	"strconv"
	"time"
)

// A FreshReplayer is a Replayer that can say, in plain commands, what its
// replay script leaves in a key that does not exist: what a replay writes
// after Redis restarted empty, or after the key expired. The reconciler
// (reconcile.Options.FreshMin) sends such batches in FreshCalls, whose
// script runs the commands on each batch's key only where the key is
// missing, with the batches' markers, and leaves the other batches to the
// replay script. The client does the algorithm's arithmetic, so a replay
// into an empty Redis costs Redis little more than the writes.
type FreshReplayer interface {
	Replayer
	// FreshWrites appends to w, with AppendFresh, the commands that leave
	// batch b's key as the replay script would leave it were the key
	// missing, and returns the extended slice. now is a lower bound of the
	// Redis time (µs) at which they run: the commands run later than the
	// script would have, never earlier, so what depends on now (a TTL, the
	// start of a merge) must be safe to compute from an earlier now. ok
	// false sends the batch to the replay script (a batch too large, or
	// one only the script can apply).
	FreshWrites(w []string, b *Batch, o ReplayOptions, now int64) (out []string, ok bool)
}

// AppendFresh appends one command of a FreshReplayer's writes to w: its
// name and its arguments after the key, which the script puts first.
func AppendFresh(w []string, name string, args ...string) []string {
	w = append(w, strconv.Itoa(1+len(args)), name)
	return append(w, args...)
}

// FreshScript applies batches to keys that do not exist, with the
// markers of NewReplayScript (one hash, read first, set last): a batch
// marked before replies 0; a batch whose key is missing runs its
// commands (FreshReplayer.FreshWrites), is marked and replies 1; a batch
// whose key exists writes nothing and replies 2, for the replay script. A
// batch whose first command fails writes nothing and replies -1 (a call of
// one batch replies the error); one whose first command succeeded and a
// later one failed has counted its grants and is marked. A call of
// distinct keys asks first, in one EXISTS, whether any exists.
//
// Call layout (built by FreshCall): KEYS[1] the marker hash, KEYS[1+b]
// batch b's key; ARGV[1] the number of batches, ARGV[2] the marker TTL in
// ms, ARGV[3] "1" when the keys are distinct; then for each batch its
// marker field, its number of words and its words: commands of AppendFresh.
//
// Reply: one integer per batch.
var FreshScript = NewScript("holdfast_fresh_replay", freshSource, nil)

const freshSource = `-- holdfast fresh replay (see driver.FreshScript)
local nb = 0 + ARGV[1]
local p = 4
` + luaReadBatches + luaNoneExists + `local out, marks, nm = {}, {}, 0
for b = 1, nb do
  local key = KEYS[1 + b]
  if done[b] then
    out[b] = 0
  elseif not none and redis.pcall('EXISTS', key) ~= 0 then
    -- The key exists (or EXISTS failed): the replay script applies it.
    out[b] = 2
  else
    local q, e, wrote, failed = first[b], first[b] + count[b], false, nil
    while q < e do
      local c = 0 + ARGV[q]
      local r = redis.pcall(ARGV[q + 1], key, unpack(ARGV, q + 2, q + c))
      if type(r) == 'table' and r.err then
        failed = r
        break
      end
      wrote = true
      q = q + 1 + c
    end
    if failed and not wrote then
      if nb == 1 then
        return failed
      end
      out[b] = -1
    else
      out[b] = 1
      marks[nm + 1], marks[nm + 2] = fields[b], '1'
      nm = nm + 2
    end
  end
end
` + luaMarkBatches + `return out
`

// Replies of FreshScript, per batch.
const (
	FreshFailed  = -1 // its first command failed: nothing written
	FreshBefore  = 0  // marked before: applied by an earlier call
	FreshApplied = 1  // applied now
	FreshExists  = 2  // its key exists: the replay script applies it
)

// FreshCall returns the FreshScript call that applies batches (each
// ReplayBatch's Args its FreshWrites), with markers in hash marker that
// live ttl.
func FreshCall(marker string, ttl time.Duration, batches []ReplayBatch) Call {
	na := 3
	for _, b := range batches {
		na += 2 + len(b.Args)
	}
	keys := make([]string, 0, 1+len(batches))
	args := make([]string, 0, na)
	keys = append(keys, marker)
	args = append(args, strconv.Itoa(len(batches)), strconv.FormatInt(max(ttl.Milliseconds(), 1), 10), distinctKeys(batches))
	for _, b := range batches {
		keys = append(keys, b.Key)
		args = append(args, b.Field, strconv.Itoa(len(b.Args)))
		args = append(args, b.Args...)
	}
	return Call{Script: FreshScript, Keys: keys, Args: args}
}

// distinctKeys is "1" when no two batches share a key, else "0".
func distinctKeys(batches []ReplayBatch) string {
	if len(batches) > 1 {
		seen := make(map[string]struct{}, len(batches))
		for _, b := range batches {
			if _, ok := seen[b.Key]; ok {
				return "0"
			}
			seen[b.Key] = struct{}{}
		}
	}
	return "1"
}

// TimeScript replies Redis's clock: {seconds, microseconds}.
var TimeScript = NewScript("holdfast_time", "local t = redis.call('TIME')\nreturn {tonumber(t[1]), tonumber(t[2])}", nil)
