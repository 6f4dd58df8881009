// Package core is what an application uses of holdfast: what a rate limit
// is (Policy, built by an algorithm package: tokenbucket.Policy,
// slidingwindow.Policy, slidingcounter.Policy), what a decision says
// (Result), the Limiter that decides through a store, and the errors.
//
// NewLimiter over a store (backend/memory for one process, backend/goredis
// or backend/rueidis for a limit shared through Redis) gives Allow, AllowN,
// Peek (what AllowN would answer, spending nothing), Reset, and AllowAll
// (several limits charged all or nothing). Errors are tested with errors.Is
// (ErrInvalidCost, ErrCostExceedsLimit, ErrEmptyKey, ErrKeyTooLong,
// ErrStoreUnavailable, …) and ClassOf tells a wrong request from a store
// that cannot serve. For a limit that keeps holding when Redis fails, wrap
// the Redis store in fallback.New instead of calling NewLimiter: it is a
// Decider and a MultiDecider too.
//
// Store and algorithm authors find what they implement and call in package
// core/driver.
package core
