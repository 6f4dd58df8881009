package driver

import (
	"context"
	"testing"
)

func TestHashSlot(t *testing.T) {
	// Slots as Redis reports them with CLUSTER KEYSLOT.
	for _, tc := range []struct {
		key  string
		slot int
	}{
		{"foo", 12182},
		{"bar", 5061},
		{"123456789", 12739}, // CRC16/XMODEM check value 0x31C3
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"user1000", 3443},
		{"foo{}{bar}", 8363}, // empty tag: the whole key
		{"foo{{bar}}zap", 4015},
		{"foo{bar}{zap}", 5061},
		{"", 0},
	} {
		if got := HashSlot(tc.key); got != tc.slot {
			t.Errorf("HashSlot(%q) = %d, want %d", tc.key, got, tc.slot)
		}
	}
}

type wrapped struct{ Store }

func (w wrapped) Unwrap() Store { return w.Store }

type shardedStore struct{ Store }

func (shardedStore) Shards(context.Context) ([]Shard, error) { return []Shard{{ID: "a"}}, nil }

func TestShardedOf(t *testing.T) {
	if ShardedOf(nil) != nil {
		t.Error("ShardedOf(nil) != nil")
	}
	var plain Store = wrapped{}
	if ShardedOf(plain) != nil {
		t.Error("a store that wraps nothing sharded was found sharded")
	}
	s := shardedStore{}
	if sh := ShardedOf(wrapped{wrapped{s}}); sh == nil {
		t.Error("a sharded store two wrappers deep was not found")
	}
}

func TestStorageSlot(t *testing.T) {
	keys := []string{"", "a", "}", "{", "a}b", "{x}", "}}{{", "user:1000", "\x00\xff}"}
	for i := range 2000 {
		b := make([]byte, i%40)
		for j := range b {
			b[j] = byte((i*31 + j*17) % 256)
		}
		keys = append(keys, string(b))
	}
	for _, prefix := range []string{"hf:", "", "p{x}:"} {
		for _, k := range keys {
			if got, want := StorageSlot(prefix, "pol", k), HashSlot(StorageKey(prefix, "pol", k)); got != want {
				t.Fatalf("StorageSlot(%q, pol, %q) = %d, HashSlot of the key %d", prefix, k, got, want)
			}
		}
	}
}

// TestSlotTag: every slot has a tag, and a key named with it hashes to the
// slot.
func TestSlotTag(t *testing.T) {
	seen := map[string]bool{}
	for s := range SlotCount {
		tag := SlotTag(s)
		if tag == "" || seen[tag] || len(tag) > 4 {
			t.Fatalf("slot %d: tag %q (empty, repeated or long)", s, tag)
		}
		seen[tag] = true
		if got := HashSlot("hf:{" + tag + "}:rb:app1:7:0"); got != s {
			t.Fatalf("slot %d: tag %q hashes to %d", s, tag, got)
		}
	}
}

// reporting is a Sharded store that says whether it is on Cluster.
type reporting struct {
	shardedStore
	on bool
}

func (r reporting) OnCluster() bool { return r.on }

// TestOnCluster: a store's own answer, found through wrappers, wins; a
// Sharded store that cannot tell counts as on Cluster; others are not.
func TestOnCluster(t *testing.T) {
	for _, tc := range []struct {
		s    Store
		want bool
	}{
		{wrapped{}, false},
		{shardedStore{}, true},
		{wrapped{shardedStore{}}, true},
		{reporting{on: false}, false},
		{wrapped{wrapped{reporting{on: false}}}, false},
		{wrapped{reporting{on: true}}, true},
		{nil, false},
	} {
		if got := OnCluster(tc.s); got != tc.want {
			t.Errorf("OnCluster(%T %+v) = %v, want %v", tc.s, tc.s, got, tc.want)
		}
	}
}
