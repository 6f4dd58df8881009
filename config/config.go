// Package config loads the policies of a holdfast service from YAML:
//
//	prefix: "hf:"            # optional storage key prefix ("" means core.DefaultPrefix)
//	client_ip:               # optional: how ip keys find and group client addresses
//	  trusted_proxies: 1     #   proxies in front that append to the header (default 0: the peer address)
//	  header: x-forwarded-for  # or forwarded (RFC 7239)
//	  ipv6_prefix: 64        #   IPv6 clients per key (default 64)
//	  ipv4_prefix: 32        #   IPv4 clients per key (default 32)
//	policies:
//	  - name: tb
//	    path: /api/tb         # optional: the route, for services the config routes
//	    algorithm: token_bucket
//	    capacity: 20
//	    refill_per_second: 5
//	    key: header:X-Client-ID  # optional: header:NAME | cookie:NAME | query:NAME | ip
//	    outage: leases        # optional: leases (default) | fail_closed | fail_open
//	  - name: sw
//	    path: /api/sw
//	    algorithm: sliding_window
//	    limit: 20
//	    window: 2s
//	    key: ip
//
// Loading is strict: an unknown or repeated field, a missing required field,
// a field of the other algorithm, a number that cannot describe a limit, a
// repeated name, an empty policy list or a second YAML document is an
// error. Every error about a policy is a *FieldError that names the policy
// (by name, or by position when it has none) and the field; errors about the
// policy numbers wrap core.ErrInvalidPolicy.
//
// Several policies may share a path, with the same key: they limit the
// route together, all or nothing (Routes, httplimit.Rule.Also), e.g. 10
// per second and 1000 per day for one client.
//
// path and key are optional so that a service that routes itself (with
// chi, gorilla/mux or its own code) and finds keys its own way (a token's
// subject, a path parameter) can keep only its limits here; a service that
// routes by the config, such as holdfast-demo serve, requires both.
// Policy.Rule is a policy's httplimit.Rule. The top-level trust_proxy: true
// of earlier versions still means client_ip's trusted_proxies: 1.
package config

import (
	"fmt"
	"os"
	"strings"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/httplimit"
)

// MaxSize is the largest config Load accepts, in bytes.
const MaxSize = 1 << 20

// MaxPrefixLen is the longest storage key prefix, in bytes. A prefix is
// printable ASCII without spaces or the hash-tag braces '{' and '}'.
const MaxPrefixLen = 64

// Config is a loaded config: the storage key prefix and the policies, each
// with the route it limits.
type Config struct {
	// Prefix starts every storage key; "" means core.DefaultPrefix.
	Prefix string
	// Policies are the policies in file order.
	Policies []Policy
}

// Policy is one limit: a validated policy, where it applies, how a
// request's client key is found and what the policy does while Redis is
// down.
type Policy struct {
	// Name is the policy's name, equal to Policy.Name().
	Name string
	// Path is the route the policy limits, an http.ServeMux pattern; ""
	// when the service routes the policy itself.
	Path string
	// Policy is the validated limit.
	Policy core.Policy
	// Key says where a request's client key comes from; the zero
	// KeySource when the service finds keys itself.
	Key KeySource
	// Outage is the policy's behaviour while Redis is unavailable.
	Outage fallback.OutageMode
}

// Rule returns p as an httplimit.Rule: its policy, its key source's
// KeyFunc (nil when p has none: set Rule.Key before httplimit.New) and the
// Outage that decides a store error the limiter returns: FailClosed for
// fail_closed, FailOpen for leases and fail_open (only a fallback.Limiter
// can lease, and it decides store failures itself).
func (p Policy) Rule() httplimit.Rule {
	r := httplimit.Rule{Policy: p.Policy, Key: p.Key.KeyFunc()}
	if p.Outage == fallback.FailClosed {
		r.Outage = httplimit.FailClosed
	}
	return r
}

// A Route is a path and the policies that limit it: the policies of the
// config with that path, in file order, charged together (all or nothing:
// httplimit.Rule.Also).
type Route struct {
	Path string
	// Rule has the first policy as Policy and the others as Also; its Key
	// and Outage are the first policy's (FailClosed if any policy of the
	// path is fail_closed).
	Rule httplimit.Rule
}

// Routes returns the config's routes, in the order of each path's first
// policy. Policies without a path are left out.
func (c *Config) Routes() []Route {
	var rs []Route
	at := make(map[string]int)
	for _, p := range c.Policies {
		if p.Path == "" {
			continue
		}
		i, ok := at[p.Path]
		if !ok {
			at[p.Path] = len(rs)
			rs = append(rs, Route{Path: p.Path, Rule: p.Rule()})
			continue
		}
		r := &rs[i].Rule
		r.Also = append(r.Also, p.Policy)
		if p.Outage == fallback.FailClosed {
			r.Outage = httplimit.FailClosed
		}
	}
	return rs
}

// LoadFile is Load of the file at path.
func LoadFile(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	return Load(f)
}

// OutageModes returns each policy's outage mode by policy name, the shape
// fallback.Options.OutageModes takes.
func (c *Config) OutageModes() map[string]fallback.OutageMode {
	m := make(map[string]fallback.OutageMode, len(c.Policies))
	for _, p := range c.Policies {
		m[p.Name] = p.Outage
	}
	return m
}

// Registry returns the policies by name.
func (c *Config) Registry() core.Policies {
	ps := make(core.Policies, len(c.Policies))
	for _, p := range c.Policies {
		ps[p.Name] = p.Policy
	}
	return ps
}

// Validate checks a Config as Load does: at least one policy, each valid,
// with a good path and key source if it has them, and no name or path used
// twice. Load calls it; it is for configs built in code.
func (c *Config) Validate() error {
	if len(c.Prefix) > MaxPrefixLen || !printable(c.Prefix) || strings.ContainsAny(c.Prefix, "{} ") {
		return &FieldError{Index: -1, Field: "prefix", Msg: fmt.Sprintf("want at most %d bytes of printable ASCII without spaces or braces, got %s", MaxPrefixLen, show(c.Prefix))}
	}
	if len(c.Policies) == 0 {
		return &FieldError{Index: -1, Field: "policies", Msg: "empty, want at least one policy"}
	}
	names := make(map[string]int, len(c.Policies))
	paths := make(map[string]int, len(c.Policies))
	for i, p := range c.Policies {
		fe := func(field, format string, args ...any) error {
			return &FieldError{Policy: p.Name, Index: i, Field: field, Msg: fmt.Sprintf(format, args...)}
		}
		switch {
		case !p.Policy.Valid():
			return &FieldError{Policy: p.Name, Index: i, Msg: "zero core.Policy", Err: core.ErrInvalidPolicy}
		case p.Name != p.Policy.Name():
			return fe("name", "%s differs from the policy's name %s", show(p.Name), show(p.Policy.Name()))
		case p.Key.kind == ipKey && checkIP(p.Key.IP) != "":
			return fe("key", "client_ip: %s", checkIP(p.Key.IP))
		case p.Outage < fallback.Leases || p.Outage > fallback.FailOpen:
			return fe("outage", "unknown mode %d", int(p.Outage))
		}
		if j, dup := names[p.Name]; dup {
			return fe("name", "%s is already the name of policy #%d", show(p.Name), j+1)
		}
		names[p.Name] = i
		if p.Path == "" {
			continue
		}
		if msg := checkPath(p.Path); msg != "" {
			return fe("path", "%s", msg)
		}
		if j, dup := paths[p.Path]; dup {
			// Policies of one path are charged together, for one key.
			if c.Policies[j].Key != p.Key {
				return fe("key", "differs from the key of policy %s, whose path %s it shares: the policies of one path are charged together, for one client key", show(c.Policies[j].Name), show(p.Path))
			}
			continue
		}
		paths[p.Path] = i
	}
	return nil
}

// checkPath returns what is wrong with a route path, or "". A path starts
// with '/' and holds only URI path characters, without '%' escapes or
// ServeMux wildcards, so registering it cannot fail.
func checkPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		return fmt.Sprintf("must start with '/', got %s", show(p))
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~!$&'()*+,;=:@/", c) >= 0
		if !ok {
			return fmt.Sprintf("byte %q not allowed in %s (use letters, digits and -._~!$&'()*+,;=:@/)", c, show(p))
		}
	}
	return ""
}

// A FieldError reports a bad value in a config: the policy, the field and
// what is wrong. Err, when set, is the cause (core.ErrInvalidPolicy for the
// policy numbers) and is what errors.Is and errors.As see.
type FieldError struct {
	// Policy is the policy's name; "" when it has none.
	Policy string
	// Index is the policy's position in the list, from 0; -1 for a
	// top-level field.
	Index int
	// Field is the YAML field; "" for the policy as a whole.
	Field string
	// Msg says what is wrong.
	Msg string
	// Err is the cause, or nil.
	Err error
}

// Error returns e.g. `config: policy "tb": refill_per_second: must be a
// positive number, got -1`.
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	switch {
	case e.Index < 0:
	case e.Policy != "":
		fmt.Fprintf(&b, "policy %s: ", show(e.Policy))
	default:
		fmt.Fprintf(&b, "policy #%d: ", e.Index+1)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// show quotes a value from the config for an error message, cut to 64 bytes
// so that a huge value cannot flood a log.
func show(s string) string {
	const max = 64
	if len(s) > max {
		return fmt.Sprintf("%q...", s[:max])
	}
	return fmt.Sprintf("%q", s)
}
