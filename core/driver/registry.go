package driver

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// CheckPolicyName reports whether name can name a policy (letters, digits,
// '_', '-', '.'; it is part of every storage key), as NewPolicy checks it.
func CheckPolicyName(name string) error { return checkName(name) }

// A RateAlgorithm is an Algorithm whose policies are a capacity and a
// refill rate (a token bucket): configured as capacity and
// refill_per_second.
type RateAlgorithm interface {
	Algorithm
	// RatePolicy returns a policy named name of the given capacity,
	// refilled at perSecond units a second.
	RatePolicy(name string, capacity int64, perSecond float64) (Policy, error)
}

// A WindowAlgorithm is an Algorithm whose policies are a limit per window
// (a sliding window): configured as limit and window.
type WindowAlgorithm interface {
	Algorithm
	// WindowPolicy returns a policy named name that admits limit units
	// per window.
	WindowPolicy(name string, limit int64, window time.Duration) (Policy, error)
}

var registry struct {
	mu     sync.RWMutex
	byName map[string]Algorithm
}

// Register makes alg known by its Name to everything that finds an
// algorithm by name: the config loader and the fallback layer's state dir.
// An algorithm package registers itself in an init function; importing
// package algorithms registers every built-in one. Registering a second
// algorithm under a name that is taken panics.
func Register(alg Algorithm) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.byName == nil {
		registry.byName = map[string]Algorithm{}
	}
	if prev, ok := registry.byName[alg.Name()]; ok && prev != alg {
		panic(fmt.Sprintf("core: algorithm %q registered twice", alg.Name()))
	}
	registry.byName[alg.Name()] = alg
}

// AlgorithmByName returns the algorithm registered as name, or an error
// wrapping ErrUnknownPolicy that lists the registered ones.
func AlgorithmByName(name string) (Algorithm, error) {
	registry.mu.RLock()
	alg, ok := registry.byName[name]
	registry.mu.RUnlock()
	if !ok {
		return nil, errorf(ErrUnknownPolicy, "unknown algorithm %q (registered: %v)", name, AlgorithmNames())
	}
	return alg, nil
}

// AlgorithmNames returns the registered algorithms' names, sorted.
func AlgorithmNames() []string {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	names := make([]string, 0, len(registry.byName))
	for n := range registry.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
