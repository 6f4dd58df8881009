package core

import "github.com/holdfast/holdfast/core/driver"

// Names that moved to package driver, kept here while the packages that
// use them move over.

const MaxPolicyName = driver.MaxPolicyName
const ReplyLen = driver.ReplyLen
const RequestIDLen = driver.RequestIDLen
const SlotCount = driver.SlotCount

var AlgorithmByName = driver.AlgorithmByName
var AlgorithmNames = driver.AlgorithmNames
var AppendStorageKey = driver.AppendStorageKey
var CheckPolicyName = driver.CheckPolicyName
var CheckRequest = driver.CheckRequest
var DeadlineArg = driver.DeadlineArg
var Errorf = driver.Errorf
var GroupShards = driver.GroupShards
var HashSlot = driver.HashSlot
var IsLocal = driver.IsLocal
var MultiCall = driver.MultiCall
var NewDecisionScript = driver.NewDecisionScript
var NewDecisionScripts = driver.NewDecisionScripts
var NewMultiReplayScript = driver.NewMultiReplayScript
var NewPolicy = driver.NewPolicy
var NewRequestID = driver.NewRequestID
var NewScript = driver.NewScript
var ParseArgs = driver.ParseArgs
var ParseReply = driver.ParseReply
var RefundArgs = driver.RefundArgs
var Register = driver.Register
var ReplyOf = driver.ReplyOf
var ResetScript = driver.ResetScript
var ShardedOf = driver.ShardedOf
var SplitReply = driver.SplitReply
var StorageKey = driver.StorageKey
var StorageSlot = driver.StorageSlot
var TrimDeadline = driver.TrimDeadline

type Algorithm = driver.Algorithm
type Batch = driver.Batch
type Call = driver.Call
type CallResult = driver.CallResult
type DirectAlgorithm = driver.DirectAlgorithm
type DirectStore = driver.DirectStore
type Grant = driver.Grant
type Lease = driver.Lease
type Leaser = driver.Leaser
type LocalFunc = driver.LocalFunc
type Localer = driver.Localer
type MultiReplayer = driver.MultiReplayer
type Peeker = driver.Peeker
type Pinger = driver.Pinger
type Pipeliner = driver.Pipeliner
type Quotaer = driver.Quotaer
type RateAlgorithm = driver.RateAlgorithm
type Reconciler = driver.Reconciler
type Refunder = driver.Refunder
type ReplayOptions = driver.ReplayOptions
type Replayer = driver.Replayer
type Reply = driver.Reply
type Script = driver.Script
type Seed = driver.Seed
type Shard = driver.Shard
type ShardSlots = driver.ShardSlots
type Sharded = driver.Sharded
type SlotRange = driver.SlotRange
type Store = driver.Store
type Unwrapper = driver.Unwrapper
type WindowAlgorithm = driver.WindowAlgorithm
