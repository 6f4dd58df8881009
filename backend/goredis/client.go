package goredis

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/holdfast/holdfast/internal/clientconf"
	"github.com/holdfast/holdfast/internal/redact"
)

// Default client deadlines. A limiter's store call must fail fast: a slow
// answer is worth less than a local decision.
const (
	// DefaultDialTimeout bounds one connection attempt.
	DefaultDialTimeout = 100 * time.Millisecond
	// DefaultReadTimeout bounds waiting for a reply.
	DefaultReadTimeout = 50 * time.Millisecond
	// DefaultWriteTimeout bounds writing a command.
	DefaultWriteTimeout = 50 * time.Millisecond
	// DefaultPoolTimeout bounds waiting for a free pooled connection.
	DefaultPoolTimeout = 100 * time.Millisecond
)

// ClientOptions tunes NewClient. The zero value of each field means its
// documented default; a value set in the URL's query (dial_timeout=...) is
// used when the field is zero.
type ClientOptions struct {
	// DialTimeout bounds one connection attempt. 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// ReadTimeout bounds waiting for a reply. 0 means DefaultReadTimeout.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a command. 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// PoolTimeout bounds waiting for a free pooled connection when the
	// context has no earlier deadline. 0 means DefaultPoolTimeout.
	PoolTimeout time.Duration
	// PoolSize is the number of pooled connections per node. 0 means
	// go-redis's default, 10 per GOMAXPROCS.
	PoolSize int
	// Cluster makes NewClient build a Redis Cluster client even from a URL
	// that names a single seed node.
	Cluster bool
	// TLS configures rediss:// connections: RootCAs for a private CA,
	// Certificates for client authentication. The server name comes from
	// the URL when TLS.ServerName is empty. nil keeps the system roots.
	// Ignored for redis:// URLs.
	TLS *tls.Config
	// Logger receives go-redis's own log lines (such as "connection pool:
	// failed to dial" while Redis is down), at level Debug: the limiter
	// reports outages itself. nil means slog.Default(). go-redis has one
	// logger per process, so the Logger of the client made last wins.
	Logger *slog.Logger
}

// clientLog is where go-redis's process-wide logger writes (see
// ClientOptions.Logger).
var (
	clientLog     atomic.Pointer[slog.Logger]
	clientLogOnce sync.Once
)

// slogLogging is go-redis's logging interface over clientLog.
type slogLogging struct{}

func (slogLogging) Printf(ctx context.Context, format string, v ...any) {
	l := clientLog.Load()
	if l == nil {
		l = slog.Default()
	}
	l.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}

// routeClientLog sends go-redis's log lines to l (nil: slog.Default()).
func routeClientLog(l *slog.Logger) {
	clientLog.Store(l)
	clientLogOnce.Do(func() { redis.SetLogger(slogLogging{}) })
}

// NewClient returns a client for a limiter on the redis:// or rediss:// URL
// rawURL. The URL names a single node, e.g. "redis://:pw@host:6379/0". A URL
// with extra seed nodes in addr parameters, such as
// "redis://host1:6379?addr=host2:6379&addr=host3:6379", or o.Cluster, builds a
// Redis Cluster client instead (database 0 only).
//
// The client never retries (MaxRetries -1, one dial attempt), honours context
// deadlines (ContextTimeoutEnabled) and has short socket deadlines, so a call
// with a 50 ms deadline returns within about 50 ms even when Redis is down or
// black-holed. It skips the CLIENT SETINFO and maintenance-notification
// handshakes (DisableIdentity, MaintNotificationsConfig disabled), so a new
// connection costs one round trip, HELLO. go-redis's check that the server
// has not closed a pooled connection runs only on one idle for a
// millisecond or more (checkedConn), not before every command. Creating it
// does not connect: it cannot fail because Redis is down.
//
// Pipelines (coalesced Run calls, RunMany) use the same pool as single
// calls (PipelinePoolSize -1), not go-redis's separate pipeline pool, which
// never keeps idle connections: a pipeline on a new connection pays the
// dial and HELLO round trips first, and on a slow link (200 ms each way,
// TestNetLatency) that alone passed the call deadline, after which the
// connection was dropped and the next pipeline dialled again.
//
// After PoolSize failed dials in a row, go-redis fails calls at once with the
// last dial error until a background dial, tried every second, succeeds: once
// Redis is back, calls may keep failing (fast) for up to about a second.
func NewClient(rawURL string, o ClientOptions) (redis.UniversalClient, error) {
	if o.DialTimeout < 0 || o.ReadTimeout < 0 || o.WriteTimeout < 0 || o.PoolTimeout < 0 || o.PoolSize < 0 {
		return nil, fmt.Errorf("goredis: negative client option in %+v", o)
	}
	routeClientLog(o.Logger)
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("goredis: redis URL: %w", redact.URLError(rawURL, err))
	}
	if o.Cluster || u.Query().Has("addr") {
		co, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("goredis: redis URL: %w", redact.URLError(rawURL, err))
		}
		tuneCluster(co, o)
		co.TLSConfig = clientconf.MergeTLS(co.TLSConfig, o.TLS)
		co.Dialer = checkedDialer(redis.NewDialer(&redis.Options{DialTimeout: co.DialTimeout, TLSConfig: co.TLSConfig}))
		return redis.NewClusterClient(co), nil
	}
	so, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("goredis: redis URL: %w", redact.URLError(rawURL, err))
	}
	tune(so, o)
	so.TLSConfig = clientconf.MergeTLS(so.TLSConfig, o.TLS)
	so.Dialer = checkedDialer(redis.NewDialer(so)) // see checkedConn
	return redis.NewClient(so), nil
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

// tune applies the limiter settings to single-node options.
func tune(so *redis.Options, o ClientOptions) {
	so.DialTimeout = pick(o.DialTimeout, so.DialTimeout, DefaultDialTimeout)
	so.ReadTimeout = pick(o.ReadTimeout, so.ReadTimeout, DefaultReadTimeout)
	so.WriteTimeout = pick(o.WriteTimeout, so.WriteTimeout, DefaultWriteTimeout)
	so.PoolTimeout = pick(o.PoolTimeout, so.PoolTimeout, DefaultPoolTimeout)
	if o.PoolSize > 0 {
		so.PoolSize = o.PoolSize
	}
	so.ContextTimeoutEnabled = true
	so.PipelinePoolSize = -1 // pipelines share the warm pool (see NewClient)
	so.MaxRetries = -1
	so.DialerRetries = 1
	so.DisableIdentity = true
	so.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// tuneCluster applies the limiter settings to cluster options.
//
// MaxRedirects is 1. go-redis counts both redirects and re-sends after a
// network error against it (a cluster client ignores MaxRetries), and 0
// would leave a MOVED after a failover unfollowed, an error for the
// caller. With 1 a call follows one MOVED or ASK, and a call that failed on
// the network is sent at most once more, within its deadline: if the first
// copy had run, Redis counts that request twice (under-admission by one
// request, as for any unknown outcome; see docs/DESIGN.md).
func tuneCluster(co *redis.ClusterOptions, o ClientOptions) {
	co.MaxRedirects = 1
	co.DialTimeout = pick(o.DialTimeout, co.DialTimeout, DefaultDialTimeout)
	co.ReadTimeout = pick(o.ReadTimeout, co.ReadTimeout, DefaultReadTimeout)
	co.WriteTimeout = pick(o.WriteTimeout, co.WriteTimeout, DefaultWriteTimeout)
	co.PoolTimeout = pick(o.PoolTimeout, co.PoolTimeout, DefaultPoolTimeout)
	if o.PoolSize > 0 {
		co.PoolSize = o.PoolSize
	}
	co.ContextTimeoutEnabled = true
	co.PipelinePoolSize = -1
	co.MaxRetries = -1
	co.DialerRetries = 1
	co.DisableIdentity = true
	co.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}
