package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredislib "github.com/redis/go-redis/v9"
	rueidislib "github.com/redis/rueidis"

	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// quietRedis drops go-redis's own log lines: they would repeat every dial
// failure of an outage, which the breaker already reports once.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { goredislib.SetLogger(quietRedis{}) }

// Redact returns the Redis URL with its password replaced by "xxxxx", for
// logs. A URL that does not parse is not shown at all: it may still hold a
// password.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL, not shown)"
	}
	return u.Redacted()
}

// scrub removes the raw URL and its password from an error message: the
// clients' URL errors quote the URL they were given.
func scrub(err error, raw string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	u, perr := url.Parse(raw)
	if perr != nil {
		return errors.New("serve: --redis is not a valid redis:// URL (value not shown: it may hold a password)")
	}
	msg = strings.ReplaceAll(msg, raw, u.Redacted())
	if pw, ok := u.User.Password(); ok && pw != "" {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
	}
	return errors.New(msg)
}

// openStore builds the configured backend's client on o.Redis, with socket
// deadlines matching the call deadline, and returns the store and a func
// that closes it. Creating a store does not need Redis up: a rueidis Redis
// Cluster client, which must read the slot map to exist, is created in the
// background (see connectingStore) when no seed answers now.
func openStore(ctx context.Context, o *Options, log *slog.Logger) (driver.Store, func(), error) {
	switch o.Backend {
	case "goredis":
		c, err := goredis.NewClient(o.Redis, goredis.ClientOptions{ReadTimeout: o.CallTimeout, WriteTimeout: o.CallTimeout, Cluster: o.RedisCluster})
		if err != nil {
			return nil, nil, scrub(err, o.Redis)
		}
		return goredis.New(c), func() { c.Close() }, nil
	case "rueidis":
		co, err := rueidislib.ParseURL(o.Redis)
		if err != nil {
			return nil, nil, scrub(fmt.Errorf("rueidis: redis URL: %w", err), o.Redis)
		}
		dial := func() (shardedStore, func(), error) {
			c, err := rueidis.NewClient(o.Redis, rueidis.ClientOptions{Cluster: o.RedisCluster, ConnWriteTimeout: o.CallTimeout})
			if err != nil {
				return nil, nil, scrub(err, o.Redis)
			}
			return rueidis.New(c), c.Close, nil
		}
		if len(co.InitAddress) < 2 && !o.RedisCluster {
			// A single-node client connects on first use.
			s, closeFn, err := dial()
			if err != nil {
				return nil, nil, err
			}
			return s, closeFn, nil
		}
		s := newConnectingStore(ctx, "Redis Cluster seeds "+strings.Join(co.InitAddress, ","), dial, time.Second, log)
		return s, s.Close, nil
	}
	return nil, nil, fmt.Errorf("serve: --backend %q: want goredis or rueidis", o.Backend)
}

// shardedStore is what the Redis backends' stores implement.
type shardedStore interface {
	driver.Store
	driver.Pinger
	driver.Pipeliner
	driver.Commander
	driver.Sharded
}

// connectingStore is a store whose client is created in the background: it
// tries dial at once and then every retry until it succeeds, ctx is done
// or Close. Until then every call fails with core.ErrStoreUnavailable (so
// the fallback layer limits locally and, for Shards, retries reading the
// topology each heartbeat); from then on it delegates to the dialled
// store.
type connectingStore struct {
	what   string // names the target in errors and logs, password-free
	dial   func() (shardedStore, func(), error)
	retry  time.Duration
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	cur     atomic.Pointer[shardedStore]
	mu      sync.Mutex
	lastErr error  // the last dial error, while not connected
	closeFn func() // closes the dialled client
	closed  bool
	once    sync.Once
}

var _ shardedStore = (*connectingStore)(nil)

// newConnectingStore tries dial once now and, if that fails, keeps trying
// in the background every retry.
func newConnectingStore(ctx context.Context, what string, dial func() (shardedStore, func(), error), retry time.Duration, log *slog.Logger) *connectingStore {
	s := &connectingStore{what: what, dial: dial, retry: retry, log: log, done: make(chan struct{})}
	ctx, s.cancel = context.WithCancel(ctx)
	if s.try() {
		close(s.done)
		return s
	}
	if authError(s.err()) {
		log.Error("holdfast serve: Redis REFUSES this instance's credentials or permissions; limiting locally; fix the user/password or ACL in --redis (retrying in the background)",
			"target", what, "retry", retry, "err", s.err())
	} else {
		log.Warn("holdfast serve: Redis not reachable, limiting locally; connecting in the background",
			"target", what, "retry", retry, "err", s.err())
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(retry)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if s.try() {
					log.Info("holdfast serve: connected to Redis", "target", what)
					return
				}
			}
		}
	}()
	return s
}

// try dials once and installs the store; it reports whether the store is
// connected (or closed: there is nothing left to try).
func (s *connectingStore) try() bool {
	st, closeFn, err := s.dial()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.lastErr = err
		return s.closed
	}
	if s.closed { // Close ran while dialling
		closeFn()
		return true
	}
	s.closeFn = closeFn
	s.cur.Store(&st)
	return true
}

// err is the error of a call made before the store is connected.
func (s *connectingStore) err() error {
	s.mu.Lock()
	last := s.lastErr
	s.mu.Unlock()
	if last == nil {
		return fmt.Errorf("%w: serve: not connected to %s yet", core.ErrStoreUnavailable, s.what)
	}
	return fmt.Errorf("%w: serve: not connected to %s yet (retrying every %v): %v", core.ErrStoreUnavailable, s.what, s.retry, last)
}

// store returns the dialled store, or nil before it is connected.
func (s *connectingStore) store() shardedStore {
	if p := s.cur.Load(); p != nil {
		return *p
	}
	return nil
}

// Run runs the script on the connected store.
func (s *connectingStore) Run(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	if st := s.store(); st != nil {
		return st.Run(ctx, sc, keys, args)
	}
	return nil, s.err()
}

// Ping pings the connected store.
func (s *connectingStore) Ping(ctx context.Context) error {
	if st := s.store(); st != nil {
		return st.Ping(ctx)
	}
	return s.err()
}

// RunMany runs the calls on the connected store; before, each fails.
func (s *connectingStore) RunMany(ctx context.Context, calls []driver.Call) []driver.CallResult {
	if st := s.store(); st != nil {
		return st.RunMany(ctx, calls)
	}
	err := s.err()
	out := make([]driver.CallResult, len(calls))
	for i := range out {
		out[i].Err = err
	}
	return out
}

// RunCommands runs the commands on the connected store; before, each
// fails.
func (s *connectingStore) RunCommands(ctx context.Context, cmds [][]string) []error {
	if st := s.store(); st != nil {
		return st.RunCommands(ctx, cmds)
	}
	err := s.err()
	out := make([]error, len(cmds))
	for i := range out {
		out[i] = err
	}
	return out
}

// Shards reads the topology from the connected store.
func (s *connectingStore) Shards(ctx context.Context) ([]driver.Shard, error) {
	if st := s.store(); st != nil {
		return st.Shards(ctx)
	}
	return nil, s.err()
}

// OnCluster reports whether the connected store is on Redis Cluster; true
// before it is connected, when no call reaches Redis anyway.
func (s *connectingStore) OnCluster() bool {
	if st := s.store(); st != nil {
		return driver.OnCluster(st)
	}
	return true
}

// Close stops the background dialling, waits for it and closes the client.
func (s *connectingStore) Close() {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel()
		<-s.done
		s.mu.Lock()
		closeFn := s.closeFn
		s.closeFn = nil
		s.mu.Unlock()
		if closeFn != nil {
			closeFn()
		}
	})
}

// authError reports whether err is Redis refusing the credentials or the
// ACL permissions (NOAUTH, WRONGPASS, NOPERM), which retrying alone will not
// mend.
func authError(err error) bool {
	msg := err.Error()
	for _, code := range []string{"NOAUTH", "WRONGPASS", "NOPERM", "invalid password"} {
		if strings.Contains(msg, code) {
			return true
		}
	}
	return false
}
