package rueidis

import (
	"crypto/tls"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/holdfast/holdfast/internal/clientconf"
	"github.com/holdfast/holdfast/internal/redact"
)

// Default client deadlines. A limiter's store call must fail fast: a slow
// answer is worth less than a local decision.
const (
	// DefaultDialTimeout bounds connecting, probing and the handshake.
	DefaultDialTimeout = 100 * time.Millisecond
	// DefaultConnWriteTimeout bounds a write, a call without a deadline and
	// the health PING.
	DefaultConnWriteTimeout = 50 * time.Millisecond
	// DefaultKeepAlive is the idle gap before a health PING.
	DefaultKeepAlive = 250 * time.Millisecond
	// DefaultMaxFlushDelay is ClientOptions.MaxFlushDelay's default, chosen
	// with the benchmark harness: 20–30 µs gave the most decisions/s at 16
	// to 256 callers with one connection; 50 µs and more raised the p99 of
	// calls made during a reconciliation.
	DefaultMaxFlushDelay = 20 * time.Microsecond
)

// lonePoolCleanup is how often idle pooled connections, those of lone Run
// calls, are closed.
const lonePoolCleanup = time.Second

// CrowdCalls is how many Run calls in flight on a Store make it send them
// on the connection that waits MaxFlushDelay after each flush (see
// ClientOptions.MaxFlushDelay): chosen with the benchmark harness, where
// 16 callers made the most decisions without the wait and 64 with it.
const CrowdCalls = 32

// ClientOptions tunes NewClient. The zero value of each field means its
// documented default; a value set in the URL's query (dial_timeout=...,
// write_timeout=...) is used when the field is zero.
type ClientOptions struct {
	// DialTimeout bounds dialing a new connection, the PING that probes it
	// and rueidis's HELLO handshake. 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// ConnWriteTimeout bounds a write and the health PING rueidis sends on
	// a connection that has received nothing for KeepAlive; a connection
	// that misses it is closed, failing the calls queued on it. A call
	// without a context deadline therefore waits at most about
	// 2 × KeepAlive + ConnWriteTimeout. 0 means DefaultConnWriteTimeout.
	ConnWriteTimeout time.Duration
	// KeepAlive is the idle gap before that health PING, and the TCP
	// keep-alive period (which Linux rounds up to whole seconds). 0 means
	// DefaultKeepAlive.
	KeepAlive time.Duration
	// MaxFlushDelay is how long, at most, a connection's writer waits after
	// each flush to gather more commands into the next one, when at least
	// CrowdCalls Run calls are in flight on a Store (rueidis.ClientOption.
	// MaxFlushDelay; fewer calls go on a connection that never waits).
	// Fewer, larger writes mean fewer system calls on both ends: with 64
	// callers on 2 cores, 20 µs and one connection (PipelineMultiplex 0)
	// halved the client's CPU per decision and raised decisions/s by a third
	// to a half; with 16 callers the wait cost more than it saved (no wait
	// made 1.1–1.3× the decisions). 0 means DefaultMaxFlushDelay; a negative
	// value means no wait at any concurrency (rueidis's own default).
	MaxFlushDelay time.Duration
	// PipelineMultiplex sets the pipelined connections per node to
	// 2^PipelineMultiplex (rueidis.ClientOption.PipelineMultiplex). 0 means
	// one connection per node: with a script per decision Redis, not the
	// connection, is the bottleneck, and one connection batches concurrent
	// calls into the fewest writes and reads (rueidis's own default for a
	// single node is 2 connections on 2 cores, 4 from 4 cores).
	PipelineMultiplex int
	// Cluster makes NewClient build a Redis Cluster client even from a URL
	// that names a single seed node.
	Cluster bool
	// TLS configures rediss:// connections: RootCAs for a private CA,
	// Certificates for client authentication. The server name comes from
	// the URL when TLS.ServerName is empty. nil keeps the system roots.
	// Ignored for redis:// URLs.
	TLS *tls.Config
}

// NewClient returns a client for a limiter on the redis:// or rediss:// URL
// rawURL. The URL names a single node, e.g. "redis://:pw@host:6379/0". A URL
// with extra seed nodes in addr parameters, such as
// "redis://host1:6379?addr=host2:6379&addr=host3:6379", or o.Cluster, builds a
// Redis Cluster client instead.
//
// The client never retries (DisableRetry), has client-side caching off, and
// has short deadlines, so a call with a 50 ms deadline returns within about
// 50 ms even when Redis is down or black-holed. It always pipelines
// (AlwaysPipelining): every connection then has a reader goroutine that sees
// a server close it, so after a Redis restart the first call already uses a
// new connection instead of failing on the dead one. Each new connection must
// answer a PING before rueidis gets it (see probing). Beside it, the client
// holds an unpipelined one for the Run calls a Store makes while at most
// LoneCalls are in flight, and a pipelined one without MaxFlushDelay for
// those made while fewer than CrowdCalls are (see Store); Close closes them
// all.
//
// A single-node client does not need Redis up to be created: rueidis dials at
// once, but NewClient ignores that first failure (bounded by DialTimeout)
// and the client connects on first use. A cluster client must read the slot
// map, so NewClient fails, after about DialTimeout per seed node, when no seed
// answers; the caller retries creating it (the demo's serve does, in the
// background, deciding locally meanwhile).
func NewClient(rawURL string, o ClientOptions) (rueidis.Client, error) {
	if o.DialTimeout < 0 || o.ConnWriteTimeout < 0 || o.KeepAlive < 0 || o.PipelineMultiplex < 0 {
		return nil, fmt.Errorf("rueidis: negative client option in %+v", o)
	}
	co, err := rueidis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("rueidis: redis URL: %w", redact.URLError(rawURL, err))
	}
	co.TLSConfig = clientconf.MergeTLS(co.TLSConfig, o.TLS)
	co.Dialer.Timeout = pick(o.DialTimeout, co.Dialer.Timeout, DefaultDialTimeout)
	co.ConnWriteTimeout = pick(o.ConnWriteTimeout, co.ConnWriteTimeout, DefaultConnWriteTimeout)
	co.Dialer.KeepAlive = pick(o.KeepAlive, co.Dialer.KeepAlive, DefaultKeepAlive)
	co.AlwaysPipelining = true // see the doc comment
	if o.MaxFlushDelay == 0 {
		o.MaxFlushDelay = DefaultMaxFlushDelay
	}
	co.MaxFlushDelay = max(o.MaxFlushDelay, 0)
	co.PipelineMultiplex = o.PipelineMultiplex
	if o.PipelineMultiplex == 0 {
		co.PipelineMultiplex = -1 // rueidis: one connection
	}
	dial := co.DialCtxFn                // keeps unix:// dialing
	co.DialCtxFn = probing(dial, false) // see probing
	co.DisableRetry = true
	co.DisableCache = true
	co.ClientSetInfo = rueidis.DisableClientSetInfo
	single := len(co.InitAddress) == 1 && !o.Cluster
	co.ForceSingleClient = single
	c, err := newClient(co, single)
	if err != nil {
		return nil, err
	}
	var quick rueidis.Client // pipelined, never waiting: fewer calls in flight
	if co.MaxFlushDelay > 0 {
		qo := co
		qo.MaxFlushDelay = 0
		if quick, err = newClient(qo, single); err != nil {
			c.Close()
			return nil, err
		}
	}
	// The lone calls' client: a pooled connection per call in flight,
	// each checked before use after an idle spell (checkedConn); idle
	// ones are closed every second.
	lo := co
	lo.AlwaysPipelining = false
	lo.DisableAutoPipelining = true
	lo.BlockingPoolCleanup = lonePoolCleanup
	lo.DialCtxFn = probing(dial, true)
	lone, err := newClient(lo, single)
	if err != nil {
		c.Close()
		if quick != nil {
			quick.Close()
		}
		return nil, err
	}
	return &client{Client: c, lone: lone, quick: quick}, nil
}

// newClient is rueidis.NewClient. A single-node client is returned even
// when its first dial failed: rueidis redials on use.
func newClient(co rueidis.ClientOption, single bool) (rueidis.Client, error) {
	c, err := rueidis.NewClient(co)
	if err != nil && c != nil && single {
		// ForceSingleClient returns a working client along with the
		// failure of its first dial; it redials on use.
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rueidis: connect %v: %w", co.InitAddress, err)
	}
	return c, nil
}

// client is the rueidis.Client NewClient returns: the shared, pipelined
// client, which serves every call made on it and a Store's Run calls when
// CrowdCalls or more are in flight, and beside it the clients of a Store's
// lone Run calls and of its other ones (see Store).
type client struct {
	rueidis.Client
	lone  rueidis.Client
	quick rueidis.Client // nil without a MaxFlushDelay
}

// Close closes the clients.
func (c *client) Close() {
	c.Client.Close()
	c.lone.Close()
	if c.quick != nil {
		c.quick.Close()
	}
}

// pick returns the first positive duration.
func pick(ds ...time.Duration) time.Duration {
	for _, d := range ds {
		if d > 0 {
			return d
		}
	}
	return 0
}
