// Package core is holdfast's portable layer: what a rate limit is (Policy,
// built by an algorithm package such as tokenbucket or slidingwindow), what a
// decision says (Result), and Limiter, which decides through a Store.
//
// Applications use a handful of names: a Policy from tokenbucket.Policy or
// slidingwindow.Policy, NewLimiter over a store (backend/memory for one
// process, backend/goredis or backend/rueidis for a limit shared through
// Redis), Limiter.Allow and Limiter.AllowN, the Result, and the errors
// (ErrInvalidCost, ErrCostExceedsLimit, ErrEmptyKey, ErrKeyTooLong,
// ErrStoreUnavailable, …) with ClassOf to tell a wrong request from a store
// that cannot serve. For a limit that keeps holding when Redis fails, wrap
// the Redis store in fallback.New instead of calling NewLimiter.
//
// Store and algorithm authors implement the small interfaces here: Store
// (one atomic script step), the optional Pinger, Pipeliner and Sharded, and
// Algorithm with its Script (NewDecisionScript for a step that spends
// quota). storetest holds the conformance suite every store runs.
package core
