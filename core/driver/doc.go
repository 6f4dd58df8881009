// Package driver is what holdfast's stores and algorithms implement and
// call, as database/sql/driver is for database drivers: applications use
// package core.
//
// A store (backend/goredis, backend/rueidis, backend/memory) implements
// Store, one atomic script step, and the optional Pinger, Pipeliner,
// Sharded (Redis Cluster slots: HashSlot, GroupShards) and DirectStore. An
// algorithm (algorithms/tokenbucket, …) implements Algorithm with its
// Script (NewDecisionScripts for a step that spends quota, and its peek),
// and the capabilities the other layers find by type assertion: Leaser
// and Lease (an instance's share during an outage), Replayer (the replay
// of an outage's grants, a body NewReplayScript wraps), Quotaer, Peeker and
// Refunder; Register makes it known by name. Policy, the errors and
// StoreError are core's too (the same types and values). storetest holds
// the conformance suite every store runs.
package driver
