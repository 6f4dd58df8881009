package driver

import (
	"context"
	"strconv"
	"strings"
	"sync"
)

// SlotCount is the number of Redis Cluster hash slots.
const SlotCount = 16384

// SlotRange is an inclusive range of Redis Cluster hash slots.
type SlotRange struct {
	Start, End int
}

// A Shard is one Redis Cluster master's share of the slots, as seen when the
// topology was read. A failover moves the whole shard to a replica, so the
// ranges stay together.
type Shard struct {
	// ID names the master that served the shard when it was read.
	ID string
	// Slots are the slot ranges the shard serves.
	Slots []SlotRange
}

// Sharded is implemented by stores on Redis Cluster. The fallback layer uses
// it to scope its circuit breaker to one shard, so a failed master sends only
// its own keys to local leases.
type Sharded interface {
	// Shards returns the cluster's shards, or nil when the store is not a
	// cluster.
	Shards(ctx context.Context) ([]Shard, error)
}

// Unwrapper is implemented by store decorators (metrics, tracing) so that
// optional interfaces of the store they wrap can still be found.
type Unwrapper interface {
	Unwrap() Store
}

// ShardedOf returns s, or the first store s wraps, as a Sharded; nil if
// none is.
func ShardedOf(s Store) Sharded {
	var sh Sharded
	unwrapped(s, func(s Store) bool {
		sh, _ = s.(Sharded)
		return sh != nil
	})
	return sh
}

// unwrapped calls f on s and on each store s wraps (Unwrapper), in order,
// until f returns true.
func unwrapped(s Store, f func(Store) bool) {
	for s != nil && !f(s) {
		u, ok := s.(Unwrapper)
		if !ok {
			return
		}
		s = u.Unwrap()
	}
}

// HashSlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (the text between the first '{' and the first '}' after it, when
// not empty) or of the whole key, modulo 16384.
func HashSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crcString(0, key)) & (SlotCount - 1)
}

// StorageSlot is HashSlot(StorageKey(prefix, policy, key)), computed
// without building the key.
func StorageSlot(prefix, policy, key string) int {
	if strings.ContainsAny(prefix, "{}") || strings.ContainsAny(policy, "{}") {
		return HashSlot(StorageKey(prefix, policy, key))
	}
	// The tag is policy:key up to the key's first '}' (never empty: a
	// policy name is not).
	if i := strings.IndexByte(key, '}'); i >= 0 {
		key = key[:i]
	}
	var crc uint16
	crc = crcString(crc, policy)
	crc = crc<<8 ^ crcTable[byte(crc>>8)^':']
	crc = crcString(crc, key)
	return int(crc) & (SlotCount - 1)
}

func crcString(crc uint16, s string) uint16 {
	for k := 0; k < len(s); k++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[k]]
	}
	return crc
}

// crcTable is CRC16-CCITT (XMODEM, polynomial 0x1021) by leading byte.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// ShardSlots is one slot range and the master serving it, as a store reads
// it from CLUSTER SLOTS.
type ShardSlots struct {
	Master string
	Range  SlotRange
}

// GroupShards groups slot ranges by master, in order of each master's first
// range; it checks that every range lies within the slot space.
func GroupShards(ranges []ShardSlots) ([]Shard, error) {
	var out []Shard
	index := map[string]int{}
	for _, r := range ranges {
		if r.Range.Start < 0 || r.Range.End >= SlotCount || r.Range.Start > r.Range.End {
			return nil, errorf(ErrMalformedReply, "CLUSTER SLOTS: bad slot range %d-%d", r.Range.Start, r.Range.End)
		}
		i, ok := index[r.Master]
		if !ok {
			i = len(out)
			index[r.Master] = i
			out = append(out, Shard{ID: r.Master})
		}
		out[i].Slots = append(out[i].Slots, r.Range)
	}
	return out, nil
}

// A ClusterReporter is a store that can tell, without a round trip,
// whether it runs on Redis Cluster.
type ClusterReporter interface {
	OnCluster() bool
}

// OnCluster reports whether s, or the first store s wraps that can tell,
// runs on Redis Cluster (ClusterReporter). A store that cannot tell is on
// Cluster when it is Sharded: keys that must share a slot are then given
// one, which a single Redis accepts too.
func OnCluster(s Store) bool {
	on := false
	unwrapped(s, func(s Store) bool {
		switch c := s.(type) {
		case ClusterReporter:
			on = c.OnCluster()
		case Sharded:
			on = true
		default:
			return false
		}
		return true
	})
	return on
}

// SlotTag returns a short hash tag of slot: HashSlot("{" + SlotTag(s) +
// "}") is s. Keys that must live in a given slot, beside keys of a tag of
// their own, are named with it.
func SlotTag(slot int) string {
	return slotTags()[slot&(SlotCount-1)]
}

// slotTags is the first base-36 number hashing to each slot, found once.
var slotTags = sync.OnceValue(func() *[SlotCount]string {
	var tags [SlotCount]string
	for n, left := 0, SlotCount; left > 0; n++ {
		s := strconv.FormatInt(int64(n), 36)
		if slot := int(crcString(0, s)) & (SlotCount - 1); tags[slot] == "" {
			tags[slot] = s
			left--
		}
	}
	return &tags
})
