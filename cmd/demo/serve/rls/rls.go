// Package rls is the rate limit configuration of `holdfast-demo serve
// --grpc-listen`, the Envoy rate limit service (RLS v3): domains of nested
// descriptors in envoyproxy/ratelimit's YAML format, each rate limit a
// holdfast policy, and the matching of a request's descriptors against
// them. It knows nothing of gRPC: serve turns the protobuf messages into
// Entry and Descriptor values and the Items of Plan into the response.
//
// A config is one domain a file, as envoyproxy/ratelimit reads them:
//
//	domain: messaging
//	algorithm: token_bucket        # holdfast: the default for every rate_limit below
//	outage: leases                 # holdfast: leases (default) | fail_open | fail_closed
//	descriptors:
//	  - key: message_type
//	    value: marketing           # optional: without it any value matches, each its own limit
//	    descriptors:
//	      - key: to_number
//	        rate_limit:
//	          unit: day            # second, minute, hour, day, week, month (30 days), year (365 days)
//	          requests_per_unit: 5
//	          algorithm: sliding_window_counter  # holdfast, optional
//	        shadow_mode: true      # decide and count, answer OK
//
// envoyproxy/ratelimit's other fields load too: rate_limit's unlimited,
// name and replaces, and a descriptor's detailed_metric, value_to_metric,
// share_threshold, metadata and quota_mode (false only). Loading is
// strict: an unknown or misplaced field, a wrong type, a unit that is not
// one of the above, a repeated descriptor at one level, a second YAML
// document or a missing domain is a *FieldError naming the file, the
// domain and the field's path.
//
// Fixed windows become token buckets by default: requests_per_unit N per
// unit T is a bucket of capacity N refilled at N/T. Over any span d the
// bucket admits at most N + N·d/T, which for d = T is 2N: the worst case
// of a fixed window at its boundary (N at its end and N at the next one's
// start), and the same N/T over a long span, so it never admits more than
// the fixed window that the config was written for, while a client that
// spent its quota gets it back steadily instead of all at once at the top
// of the minute. It takes every number envoyproxy/ratelimit takes up to a
// million a second, where the sliding window counter's L×W ≤ 2^50 refuses
// 20000 a day. algorithm: sliding_window_counter counts the fixed windows
// themselves (at most N in each aligned window, about N in any), and
// sliding_window exactly N in any window, at a sorted-set member per unit.
package rls

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
)

// Limits on a request, checked by Plan before anything is spent.
const (
	// MaxDescriptors is the most descriptors one request may carry: the
	// most requests one core AllowAll charges.
	MaxDescriptors = core.MaxRequests
	// MaxEntries is the most entries one descriptor may have.
	MaxEntries = 16
	// MaxEntryLen is the longest key or value of an entry, in bytes.
	MaxEntryLen = 256
	// MaxDomainLen is the longest domain, in bytes.
	MaxDomainLen = 256
)

// Unit is a rate limit's unit, as envoyproxy/ratelimit names them; its
// values are those of the RLS v3 protobuf enum
// RateLimitResponse.RateLimit.Unit.
type Unit int32

// The units. Month is 30 days and year 365, as in envoyproxy/ratelimit.
const (
	Unknown Unit = iota
	Second
	Minute
	Hour
	Day
	Month
	Year
	Week
)

var unitNames = map[string]Unit{"second": Second, "minute": Minute, "hour": Hour, "day": Day, "week": Week, "month": Month, "year": Year}

// Duration is the unit's length.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// String returns the unit's config name, "unknown" for Unknown.
func (u Unit) String() string {
	for n, v := range unitNames {
		if v == u {
			return n
		}
	}
	return "unknown"
}

// A Limit is one descriptor's rate_limit block.
type Limit struct {
	// Domain is the domain the limit belongs to.
	Domain string
	// KeyPath is the descriptor's keys from the top, joined by '.', e.g.
	// "message_type.to_number": what metrics label a decision with (never
	// a value, which may be client data).
	KeyPath string
	// Name is rate_limit's name, which replaces entries refer to.
	Name string
	// Replaces are the names of the limits this one drops from a request
	// it applies to.
	Replaces []string
	// Unlimited: the descriptor is known and never limited.
	Unlimited bool
	// ShadowMode: decisions are made and spent, and answered OK.
	ShadowMode bool
	// RequestsPerUnit and Unit are the limit as configured; zero
	// requests_per_unit denies every request.
	RequestsPerUnit uint32
	Unit            Unit
	// Policy is the holdfast policy that enforces the limit; invalid when
	// Unlimited or RequestsPerUnit is zero.
	Policy core.Policy
	// Outage is what the limit does while Redis is down.
	Outage fallback.OutageMode
}

// An Entry is one key and value of a request's descriptor.
type Entry struct{ Key, Value string }

// A Descriptor is one descriptor of a request: its entries, its own
// hits_addend when it has one (which may be 0: check, spend nothing), and
// the limit Envoy sent with it, if any (Override).
type Descriptor struct {
	Entries []Entry
	Hits    *uint64
	// Override, when not nil, is Envoy's limit for the descriptor: it
	// applies instead of the config's.
	Override *OverrideLimit
}

// An OverrideLimit is a limit Envoy sends with a descriptor.
type OverrideLimit struct {
	RequestsPerUnit uint32
	Unit            Unit
}

// node is one descriptor of the config tree.
type node struct {
	key, value string
	parts      []string // value split on '*' when it has a wildcard
	share      bool     // share_threshold: every match shares one limit
	limit      *Limit
	children   level
}

// level is the descriptors of one list, as a request's entry looks them up:
// key and value first, then the wildcards in config order, then the key
// alone.
type level struct {
	exact    map[Entry]*node
	wildcard []*node
	byKey    map[string]*node
}

func (l *level) find(e Entry) *node {
	if n := l.exact[e]; n != nil {
		return n
	}
	for _, n := range l.wildcard {
		if n.key == e.Key && wildcardMatch(n.parts, e.Value) {
			return n
		}
	}
	return l.byKey[e.Key]
}

func (l *level) empty() bool { return len(l.exact) == 0 && len(l.wildcard) == 0 && len(l.byKey) == 0 }

// wildcardMatch reports whether value matches the pattern split on '*' into
// parts: each '*' stands for any run of bytes, the parts in order.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// A Domain is one domain's descriptors.
type Domain struct {
	Name string
	// File is the file it was loaded from.
	File string
	root level
}

// Config is a loaded set of domains.
type Config struct {
	domains map[string]*Domain
	limits  []*Limit // every limit with a policy, in load order
	over    overrides
}

// Domains returns the domain names, sorted.
func (c *Config) Domains() []string {
	names := make([]string, 0, len(c.domains))
	for n := range c.domains {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Limits returns every limit that has a policy (neither unlimited nor
// zero), in load order.
func (c *Config) Limits() []*Limit { return c.limits }

// OutageModes returns each policy's outage mode by policy name, the shape
// fallback.Options.OutageModes takes.
func (c *Config) OutageModes() map[string]fallback.OutageMode {
	m := make(map[string]fallback.OutageMode, len(c.limits))
	for _, l := range c.limits {
		m[l.Policy.Name()] = l.Outage
	}
	return m
}

// An Item is how one descriptor of a request is to be decided.
type Item struct {
	// Limit is the matched limit; nil when no rate limit applies (no
	// match, a match without rate_limit, or a limit replaced by another
	// of the request's).
	Limit *Limit
	// Key is the client key the limit's policy is charged for: the
	// request's values along the descriptor (a shared wildcard's pattern
	// instead of its value).
	Key string
	// Cost is the hits to spend: the descriptor's hits_addend, else the
	// request's, else 1. 0 checks without spending.
	Cost uint64
	// Replaced says the matched limit was dropped by another's replaces.
	Replaced bool
}

// A RequestError is a malformed request: it is answered with an error
// (gRPC InvalidArgument) and nothing is spent.
type RequestError struct{ Msg string }

func (e *RequestError) Error() string { return "rls: " + e.Msg }

func badRequest(format string, args ...any) error {
	return &RequestError{Msg: fmt.Sprintf(format, args...)}
}

// Plan checks a request and matches each descriptor against domain's
// tree, the most specific first at each level (key and value, then a
// wildcard value, then the key alone): a descriptor matches a rate limit
// only where its last entry lands, as in envoyproxy/ratelimit, so a
// request deeper or shallower than the tree's rate limits matches none.
// hits is the request's hits_addend (0 means 1). known is false for a
// domain the config does not have: every Item is then without a Limit.
// A malformed request is a *RequestError.
func (c *Config) Plan(domain string, descs []Descriptor, hits uint32) (items []Item, known bool, err error) {
	switch {
	case domain == "":
		return nil, false, badRequest("empty domain")
	case len(domain) > MaxDomainLen:
		return nil, false, badRequest("domain of %d bytes, at most %d", len(domain), MaxDomainLen)
	case len(descs) == 0:
		return nil, false, badRequest("no descriptors")
	case len(descs) > MaxDescriptors:
		return nil, false, badRequest("%d descriptors, at most %d", len(descs), MaxDescriptors)
	}
	for i, d := range descs {
		if len(d.Entries) == 0 {
			return nil, false, badRequest("descriptor %d has no entries", i)
		}
		if len(d.Entries) > MaxEntries {
			return nil, false, badRequest("descriptor %d has %d entries, at most %d", i, len(d.Entries), MaxEntries)
		}
		for j, e := range d.Entries {
			switch {
			case e.Key == "":
				return nil, false, badRequest("descriptor %d entry %d has an empty key", i, j)
			case len(e.Key) > MaxEntryLen || len(e.Value) > MaxEntryLen:
				return nil, false, badRequest("descriptor %d entry %d: key or value longer than %d bytes", i, j, MaxEntryLen)
			}
		}
	}
	dom := c.domains[domain]
	items = make([]Item, len(descs))
	replaced := map[string]bool{}
	for i, d := range descs {
		it := &items[i]
		it.Cost = 1
		if hits > 0 {
			it.Cost = uint64(hits)
		}
		if d.Hits != nil {
			it.Cost = *d.Hits
		}
		if o := d.Override; o != nil {
			var err error
			if it.Limit, it.Key, err = c.Override(domain, d.Entries, o.RequestsPerUnit, o.Unit); err != nil {
				return nil, false, err
			}
			continue
		}
		if dom == nil {
			continue
		}
		it.Limit, it.Key = dom.match(d.Entries)
		if len(it.Key) > core.MaxKeyLen {
			return nil, false, badRequest("descriptor %d: its values make a key of %d bytes, at most %d", i, len(it.Key), core.MaxKeyLen)
		}
		if it.Limit != nil {
			for _, r := range it.Limit.Replaces {
				replaced[r] = true
			}
		}
	}
	for i := range items {
		if l := items[i].Limit; l != nil && l.Name != "" && replaced[l.Name] {
			items[i].Limit, items[i].Key, items[i].Replaced = nil, "", true
		}
	}
	return items, dom != nil, nil
}

// match walks the tree along entries and returns the rate limit where the
// last entry lands, with the client key, or nil.
func (d *Domain) match(entries []Entry) (*Limit, string) {
	lv := &d.root
	var key strings.Builder
	for i, e := range entries {
		n := lv.find(e)
		if n == nil {
			return nil, ""
		}
		v := e.Value
		if n.share {
			v = n.value
		}
		key.WriteString(strconv.Itoa(len(v)))
		key.WriteByte(':')
		key.WriteString(v)
		if i == len(entries)-1 {
			if n.limit == nil {
				return nil, ""
			}
			return n.limit, key.String()
		}
		if n.children.empty() {
			return nil, ""
		}
		lv = &n.children
	}
	return nil, ""
}

// MaxOverrides is the most distinct limits that Envoy's descriptor limit
// overrides may bring to one Config; a request with one more is a
// *RequestError.
const MaxOverrides = 1024

// overrides are the limits made for Envoy's limit overrides, by domain,
// keys and numbers.
type overrides struct {
	mu     sync.Mutex
	limits map[string]*Limit
}

// Override returns the limit of a descriptor of domain that carries its
// own limit (Envoy's RateLimitDescriptor.limit, set by a route's
// rate_limits override): requests_per_unit per unit with the default
// algorithm, keyed by every key and value of the descriptor, as
// envoyproxy/ratelimit applies it whatever the config says. Descriptors
// with the same domain, keys and numbers share a policy; their values
// choose the counter.
func (c *Config) Override(domain string, entries []Entry, rpu uint32, unit Unit) (*Limit, string, error) {
	if unit.Duration() == 0 {
		return nil, "", badRequest("a limit override with unit %d, want second to year", int32(unit))
	}
	keys := make([]string, len(entries))
	var key strings.Builder
	for i, e := range entries {
		keys[i] = e.Key
		for _, s := range []string{e.Key, e.Value} {
			key.WriteString(strconv.Itoa(len(s)))
			key.WriteByte(':')
			key.WriteString(s)
		}
	}
	if key.Len() > core.MaxKeyLen {
		return nil, "", badRequest("a limit override's keys and values make a key of %d bytes, at most %d", key.Len(), core.MaxKeyLen)
	}
	path := strings.Join(keys, ".")
	id := fmt.Sprintf("%s\x00%s\x00%d\x00%d", domain, path, rpu, unit)
	c.over.mu.Lock()
	defer c.over.mu.Unlock()
	if l := c.over.limits[id]; l != nil {
		return l, key.String(), nil
	}
	if len(c.over.limits) >= MaxOverrides {
		return nil, "", badRequest("more than %d distinct limit overrides", MaxOverrides)
	}
	l := &Limit{Domain: domain, KeyPath: path, RequestsPerUnit: rpu, Unit: unit}
	if rpu > 0 {
		h := fnv.New32a()
		h.Write([]byte(id))
		name := fmt.Sprintf("override-%08x", h.Sum32())
		alg, _ := driver.AlgorithmByName(DefaultAlgorithm)
		p, err := newPolicy(alg, name, int64(rpu), unit.Duration())
		if err != nil {
			return nil, "", badRequest("a limit override of %d per %s: %v", rpu, unit, err)
		}
		l.Policy = p
	}
	if c.over.limits == nil {
		c.over.limits = map[string]*Limit{}
	}
	c.over.limits[id] = l
	return l, key.String(), nil
}
