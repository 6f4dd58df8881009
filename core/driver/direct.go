package driver

import "context"

// A DirectAlgorithm is an Algorithm whose Go twin can be called with typed
// arguments instead of the script's string ARGV, for stores that run the
// twins in this process (DirectStore). Step must make exactly the decision
// that the script's LocalFunc makes for ARGV Args(p, cost, id, 0) at
// nowMicros, whatever id, on the key's state: prev when live is true, none
// when it is false (prev is then an expired state, or nil, that Step may
// reuse). The caller has checked p and cost (CheckRequest), so Step cannot
// fail. Like LocalFunc, it returns the next state (nil or a ttl of 0
// forgets the key) and how long the key lives, in microseconds; it may
// update prev in place and return it, so a key's decisions need not
// allocate. (No error result: the results fit in registers.)
type DirectAlgorithm interface {
	Algorithm
	Step(p Policy, prev any, live bool, nowMicros, cost int64) (next any, r Reply, ttlMicros int64)
}

// A DirectStore is a Store that can decide a request without building the
// script call: the storage key is StorageKey(prefix, p.Name(), key) and the
// step is p's DirectAlgorithm.Step. It checks the request (CheckRequest)
// itself. The decision and the state it leaves
// are those Run would give for the script call; handled is false, with
// nothing done, when the store has no direct path for p's algorithm, and
// the caller then uses Run. Limiter uses it when its store implements it;
// a store that wraps another (metrics, recorders) hides it unless it
// implements it too.
type DirectStore interface {
	Store
	RunDirect(ctx context.Context, prefix string, p Policy, key string, cost int64) (r Reply, handled bool, err error)
}
