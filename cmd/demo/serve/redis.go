package serve

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	goredislib "github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
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
// that closes the client. Creating a client does not need Redis up.
func openStore(o *Options) (core.Store, func(), error) {
	switch o.Backend {
	case "goredis":
		c, err := goredis.NewClient(o.Redis, goredis.ClientOptions{ReadTimeout: o.CallTimeout, WriteTimeout: o.CallTimeout})
		if err != nil {
			return nil, nil, scrub(err, o.Redis)
		}
		return goredis.New(c), func() { c.Close() }, nil
	case "rueidis":
		c, err := rueidis.NewClient(o.Redis, rueidis.ClientOptions{})
		if err != nil {
			return nil, nil, scrub(err, o.Redis)
		}
		return rueidis.New(c), c.Close, nil
	}
	return nil, nil, fmt.Errorf("serve: --backend %q: want goredis or rueidis", o.Backend)
}
