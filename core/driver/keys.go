package driver

import "strings"

// MaxKeyLen is the longest client key, in bytes. Keys are binary-safe.
const MaxKeyLen = 512

// Localer is implemented by stores that keep their state in this process
// (the memory backend); their decisions are reported as ModeLocal.
type Localer interface {
	Local() bool
}

// IsLocal reports whether store, or a store it wraps (Unwrapper), keeps
// its state in this process.
func IsLocal(store Store) bool {
	for store != nil {
		if lo, ok := store.(Localer); ok {
			return lo.Local()
		}
		u, ok := store.(Unwrapper)
		if !ok {
			return false
		}
		store = u.Unwrap()
	}
	return false
}

// AppendStorageKey appends StorageKey(prefix, policy, key) to b.
func AppendStorageKey(b []byte, prefix, policy, key string) []byte {
	b = append(b, prefix...)
	b = append(b, '{')
	b = append(b, policy...)
	b = append(b, ':')
	b = append(b, key...)
	return append(b, '}')
}

// StorageKey returns prefix + "{" + policy + ":" + key + "}".
func StorageKey(prefix, policy, key string) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(policy) + len(key) + 3)
	b.WriteString(prefix)
	b.WriteByte('{')
	b.WriteString(policy)
	b.WriteByte(':')
	b.WriteString(key)
	b.WriteByte('}')
	return b.String()
}

// CheckRequest validates a request before any store is touched.
func CheckRequest(p Policy, key string, cost int64) error {
	if p.alg == nil {
		return errorf(ErrInvalidPolicy, "zero Policy: build it with NewPolicy")
	}
	if key == "" {
		return errorf(ErrEmptyKey, "policy %s", p.name)
	}
	if len(key) > MaxKeyLen {
		return errorf(ErrKeyTooLong, "key of %d bytes, maximum %d", len(key), MaxKeyLen)
	}
	return p.CheckCost(cost)
}
