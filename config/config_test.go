package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/httplimit"
)

func TestLoadFile(t *testing.T) {
	c, err := LoadFile("testdata/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Prefix != "hf:" || len(c.Policies) != 2 {
		t.Fatalf("prefix %q, %d policies", c.Prefix, len(c.Policies))
	}
	tb, sw := c.Policies[0], c.Policies[1]
	checks := []struct {
		name      string
		got, want any
	}{
		{"tb name", tb.Name, "tb"},
		{"tb path", tb.Path, "/api/tb"},
		{"tb algorithm", tb.Policy.Algorithm().Name(), tokenbucket.Name},
		{"tb capacity", tb.Policy.Limit(), int64(20)},
		{"tb refill interval", tb.Policy.Interval(), 200 * time.Millisecond},
		{"tb key", tb.Key.String(), "header:X-Client-ID"},
		{"tb key header", tb.Key.Header(), "X-Client-Id"},
		{"tb outage", tb.Outage, fallback.Leases},
		{"sw name", sw.Name, "sw"},
		{"sw path", sw.Path, "/api/sw"},
		{"sw algorithm", sw.Policy.Algorithm().Name(), slidingwindow.Name},
		{"sw limit", sw.Policy.Limit(), int64(20)},
		{"sw window", sw.Policy.Interval(), 2 * time.Second},
		{"sw key", sw.Key.String(), "ip"},
		{"sw ip options", sw.Key.IP, httplimit.IPOptions{}},
		{"sw outage", sw.Outage, fallback.Leases},
		{"outage modes", len(c.OutageModes()), 2},
		{"registry", c.Registry()["sw"], sw.Policy},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestLoadOptionalFields(t *testing.T) {
	c, err := Load(strings.NewReader(`
trust_proxy: true
policies:
  - {name: login, path: /login, algorithm: token_bucket, capacity: 5, refill_per_second: 0.5, key: ip, outage: fail_closed}
  - {name: feed, path: /feed, algorithm: sliding_window, limit: 100, window: 1m, key: "header:x-api-key", outage: fail_open}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Prefix != "" {
		t.Errorf("prefix %q, want empty (core's default)", c.Prefix)
	}
	modes := c.OutageModes()
	if modes["login"] != fallback.FailClosed || modes["feed"] != fallback.FailOpen {
		t.Errorf("outage modes %v", modes)
	}
	if c.Policies[0].Key.IP != (httplimit.IPOptions{TrustedProxies: 1}) || c.Policies[0].Policy.Interval() != 2*time.Second {
		t.Errorf("login: ip options %+v, interval %v", c.Policies[0].Key.IP, c.Policies[0].Policy.Interval())
	}
	if c.Policies[1].Key.Header() != "X-Api-Key" {
		t.Errorf("feed header %q", c.Policies[1].Key.Header())
	}
}

// tbPolicy and swPolicy are valid policies, one field a line, indented for
// the policies list; tests replace or add lines.
const tbPolicy = `  - name: tb
    path: /api/tb
    algorithm: token_bucket
    capacity: 20
    refill_per_second: 5
    key: header:X-Client-ID
`

const swPolicy = `  - name: sw
    path: /api/sw
    algorithm: sliding_window
    limit: 20
    window: 2s
    key: ip
`

// tb returns the token bucket policy with field's line replaced by line
// ("" drops it); a field it does not have is added.
func tb(field, line string) string { return edit(tbPolicy, field, line) }
func sw(field, line string) string { return edit(swPolicy, field, line) }

func edit(policy, field, line string) string {
	lines := strings.SplitAfter(policy, "\n")
	for i, l := range lines {
		trimmed := strings.TrimLeft(l, " -")
		if strings.HasPrefix(trimmed, field+":") {
			if line == "" {
				if i == 0 { // keep the list item's dash
					return "  -" + strings.Join(lines[1:], "")[3:]
				}
				return strings.Join(append(lines[:i:i], lines[i+1:]...), "")
			}
			lines[i] = l[:len(l)-len(trimmed)] + line + "\n"
			return strings.Join(lines, "")
		}
	}
	return policy + "    " + line + "\n"
}

func policies(ps ...string) string { return "policies:\n" + strings.Join(ps, "") }

func TestLoadRejects(t *testing.T) {
	tests := []struct {
		name    string
		src     string
		want    []string // substrings of the error, in order
		invalid bool     // wraps core.ErrInvalidPolicy
	}{
		{"unknown top-level field", "limits: 3\n" + policies(tbPolicy), []string{`unknown top-level field "limits"`}, false},
		{"top-level field given twice", "prefix: a\nprefix: b\n" + policies(tbPolicy), []string{"prefix: given twice"}, false},
		{"unknown policy field", policies(tb("", "burst: 3")), []string{`policy "tb"`, `unknown field "burst"`}, false},
		{"field given twice", policies(tb("", "capacity: 30")), []string{`policy "tb"`, "capacity: given twice"}, false},
		{"merge key", "policies:\n  - &b {name: tb, path: /a, algorithm: token_bucket, capacity: 1, refill_per_second: 1, key: ip}\n  - {<<: *b, name: tb2, path: /b}\n", []string{`policy "tb2"`, `unknown field "<<"`}, false},
		{"policy not a mapping", policies("  - tb\n"), []string{"policy #1", "want a mapping"}, false},
		{"policies not a list", "policies: tb\n", []string{"policies: want a list of policies"}, false},
		{"empty policies", "policies: []\n", []string{"policies: empty"}, false},
		{"no policies field", "prefix: x\n", []string{"policies: empty"}, false},
		{"null policies", "policies:\n", []string{"policies: empty"}, false},
		{"null document", "~\n", []string{"policies: empty config"}, false},
		{"empty input", "", []string{"policies: empty config"}, false},
		{"two documents", policies(tbPolicy) + "---\n" + policies(swPolicy), []string{"more than one YAML document"}, false},
		{"not YAML", "policies: [\n", []string{"config: line 1:"}, false},
		{"top level a list", "- 1\n", []string{"want a mapping of prefix, client_ip and policies"}, false},
		{"prefix a list", "prefix: [a]\n" + policies(tbPolicy), []string{"prefix: want a string"}, false},
		{"prefix with brace", "prefix: \"a{\"\n" + policies(tbPolicy), []string{"prefix: want at most 64 bytes", `"a{"`}, false},
		{"prefix with control byte", "prefix: \"a\\tb\"\n" + policies(tbPolicy), []string{"prefix:"}, false},
		{"trust_proxy not a bool", "trust_proxy: yes\n" + policies(tbPolicy), []string{`trust_proxy: want true or false, got "yes"`}, false},

		{"missing name", policies(tb("name", "")), []string{"policy #1", "name: required"}, false},
		{"missing name, second policy", policies(tbPolicy, sw("name", "")), []string{"policy #2", "name: required"}, false},
		{"empty name", policies(tb("name", `name: ""`)), []string{"policy #1", "name: required"}, false},
		{"bad name", policies(tb("name", "name: a:b")), []string{`policy "a:b"`, "name:", "not allowed"}, true},
		{"name a list", policies(tb("name", "name: [a]")), []string{"policy #1", "name: want a single value"}, false},
		{"empty path", policies(tb("path", `path: ""`)), []string{`policy "tb"`, "path: empty; leave the field out"}, false},
		{"path without slash", policies(tb("path", "path: api/tb")), []string{`policy "tb"`, "path: must start with '/'"}, false},
		{"path with wildcard", policies(tb("path", "path: /api/{id}")), []string{`policy "tb"`, "path: byte '{' not allowed"}, false},
		{"path with space", policies(tb("path", `path: "/a b"`)), []string{`policy "tb"`, "path: byte ' ' not allowed"}, false},
		{"missing algorithm", policies(tb("algorithm", "")), []string{`policy "tb"`, "algorithm: required"}, false},
		{"unknown algorithm", policies(tb("algorithm", "algorithm: leaky_bucket")), []string{`policy "tb"`, `algorithm: unknown algorithm "leaky_bucket"`}, true},
		{"empty key", policies(tb("key", `key: ""`)), []string{`policy "tb"`, "key: empty; leave the field out"}, false},
		{"bad key source", policies(tb("key", "key: body:id")), []string{`policy "tb"`, `key: key source "body:id": want header:NAME, cookie:NAME, query:NAME or ip`}, false},
		{"bad cookie name", policies(tb("key", "key: cookie:a;b")), []string{`policy "tb"`, "key:", "cookie name must be a non-empty token"}, false},
		{"bad query name", policies(tb("key", "key: query:a&b")), []string{`policy "tb"`, "key:", "query parameter name"}, false},
		{"client_ip a list", "client_ip: [1]\n" + policies(tbPolicy), []string{"client_ip: want a mapping"}, false},
		{"client_ip unknown field", "client_ip: {depth: 1}\n" + policies(tbPolicy), []string{`client_ip: unknown field "depth"`}, false},
		{"client_ip field twice", "client_ip: {ipv6_prefix: 64, ipv6_prefix: 56}\n" + policies(tbPolicy), []string{"client_ip: ipv6_prefix: given twice"}, false},
		{"negative trusted_proxies", "client_ip: {trusted_proxies: -1}\n" + policies(tbPolicy), []string{"client_ip: trusted_proxies: want an integer from 0 to 2147483647, got \"-1\""}, false},
		{"trusted_proxies not a number", "client_ip: {trusted_proxies: two}\n" + policies(tbPolicy), []string{"client_ip: trusted_proxies: want an integer", `got "two"`}, false},
		{"ipv6_prefix 0", "client_ip: {ipv6_prefix: 0}\n" + policies(tbPolicy), []string{`client_ip: ipv6_prefix: want an integer from 1 to 128, got "0"`}, false},
		{"ipv6_prefix 129", "client_ip: {ipv6_prefix: 129}\n" + policies(tbPolicy), []string{"client_ip: ipv6_prefix: want an integer from 1 to 128"}, false},
		{"ipv4_prefix 33", "client_ip: {ipv4_prefix: 33}\n" + policies(tbPolicy), []string{"client_ip: ipv4_prefix: want an integer from 1 to 32"}, false},
		{"unknown proxy header", "client_ip: {header: x-real-ip}\n" + policies(tbPolicy), []string{`client_ip: header: want x-forwarded-for or forwarded, got "x-real-ip"`}, false},
		{"trust_proxy and trusted_proxies", "trust_proxy: true\nclient_ip: {trusted_proxies: 2}\n" + policies(tbPolicy), []string{"trust_proxy: give client_ip's trusted_proxies instead, not both"}, false},
		{"empty header name", policies(tb("key", "key: 'header:'")), []string{`policy "tb"`, "key:", "non-empty token"}, false},
		{"bad header name", policies(tb("key", "key: header:X Client")), []string{`policy "tb"`, "key:", "non-empty token"}, false},
		{"bad outage mode", policies(tb("", "outage: sometimes")), []string{`policy "tb"`, `outage: unknown mode "sometimes"`}, false},
		{"outage a mapping", policies(tb("", "outage: {a: 1}")), []string{`policy "tb"`, "outage: want a single value"}, false},
		{"duplicate name", policies(tbPolicy, tb("path", "path: /other")), []string{`policy "tb"`, `name: "tb" is already the name of policy #1`}, false},
		{"shared path, another key", policies(tbPolicy, sw("path", "path: /api/tb")), []string{`policy "sw"`, `key: differs from the key of policy "tb", whose path "/api/tb" it shares`}, false},

		// Token bucket numbers.
		{"window on a token bucket", policies(tb("", "window: 2s")), []string{`policy "tb"`, "window: not a token_bucket field (it belongs to sliding_window or sliding_window_counter)"}, true},
		{"limit on a token bucket", policies(tb("", "limit: 2")), []string{`policy "tb"`, "limit: not a token_bucket field"}, true},
		{"missing capacity", policies(tb("capacity", "")), []string{`policy "tb"`, "capacity: required"}, false},
		{"zero capacity", policies(tb("capacity", "capacity: 0")), []string{`policy "tb"`, "capacity: must be a positive integer, got 0"}, true},
		{"negative capacity", policies(tb("capacity", "capacity: -3")), []string{`policy "tb"`, "capacity: must be a positive integer, got -3"}, true},
		{"fractional capacity", policies(tb("capacity", "capacity: 20.5")), []string{`policy "tb"`, `capacity: must be a positive integer, got "20.5"`}, true},
		{"NaN capacity", policies(tb("capacity", "capacity: .nan")), []string{`policy "tb"`, `capacity: must be a positive integer, got ".nan"`}, true},
		{"text capacity", policies(tb("capacity", "capacity: lots")), []string{`policy "tb"`, `capacity: must be a positive integer, got "lots"`}, true},
		{"huge capacity", policies(tb("capacity", "capacity: 99999999999999999999")), []string{`policy "tb"`, "capacity: must be a positive integer"}, true},
		{"capacity above MaxLimit", policies(tb("capacity", "capacity: 2000000000")), []string{`policy "tb"`, "capacity: core: invalid policy", "out of range"}, true},
		{"missing refill_per_second", policies(tb("refill_per_second", "")), []string{`policy "tb"`, "refill_per_second: required"}, false},
		{"negative refill_per_second", policies(tb("refill_per_second", "refill_per_second: -1")), []string{`config: policy "tb": refill_per_second: must be a positive number, got -1`}, true},
		{"zero refill_per_second", policies(tb("refill_per_second", "refill_per_second: 0")), []string{`policy "tb"`, "refill_per_second: must be a positive number, got 0"}, true},
		{"NaN refill_per_second", policies(tb("refill_per_second", "refill_per_second: .nan")), []string{`policy "tb"`, "refill_per_second: must be a positive number, got NaN"}, true},
		{"infinite refill_per_second", policies(tb("refill_per_second", "refill_per_second: .inf")), []string{`policy "tb"`, "refill_per_second: must be a positive number, got +Inf"}, true},
		{"text refill_per_second", policies(tb("refill_per_second", "refill_per_second: fast")), []string{`policy "tb"`, `refill_per_second: must be a positive number, got "fast"`}, true},
		{"refill_per_second above 1e6", policies(tb("refill_per_second", "refill_per_second: 2e6")), []string{`policy "tb"`, "refill_per_second: core: invalid policy", "above 1e6"}, true},
		{"refill_per_second below one a year", policies(tb("refill_per_second", "refill_per_second: 1e-9")), []string{`policy "tb"`, "refill_per_second: core: invalid policy"}, true},

		// Sliding window numbers.
		{"capacity on a sliding window", policies(sw("", "capacity: 20")), []string{`policy "sw"`, "capacity: not a sliding_window field (it belongs to token_bucket)"}, true},
		{"refill_per_second on a sliding window", policies(sw("", "refill_per_second: 1")), []string{`policy "sw"`, "refill_per_second: not a sliding_window field"}, true},
		{"missing limit", policies(sw("limit", "")), []string{`policy "sw"`, "limit: required"}, false},
		{"zero limit", policies(sw("limit", "limit: 0")), []string{`policy "sw"`, "limit: must be a positive integer, got 0"}, true},
		{"negative limit", policies(sw("limit", "limit: -1")), []string{`policy "sw"`, "limit: must be a positive integer, got -1"}, true},
		{"limit above the sliding window's maximum", policies(sw("limit", "limit: 2000000")), []string{`policy "sw"`, "limit: core: invalid policy", "above 1000000"}, true},
		{"missing window", policies(sw("window", "")), []string{`policy "sw"`, "window: required"}, false},
		{"unparsable window", policies(sw("window", "window: 2x")), []string{`policy "sw"`, `window: must be a duration such as 2s or 500ms, got "2x"`}, true},
		{"window without unit", policies(sw("window", "window: 2")), []string{`policy "sw"`, `window: must be a duration such as 2s or 500ms, got "2"`}, true},
		{"zero window", policies(sw("window", "window: 0s")), []string{`policy "sw"`, "window: must be positive, got 0s"}, true},
		{"negative window", policies(sw("window", "window: -1s")), []string{`policy "sw"`, "window: must be positive, got -1s"}, true},
		{"window below 1ms", policies(sw("window", "window: 500us")), []string{`policy "sw"`, "window: core: invalid policy", "shorter than 1ms"}, true},
		{"window above a year", policies(sw("window", "window: 9000h")), []string{`policy "sw"`, "window: core: invalid policy", "out of range"}, true},
		{"window finer than a microsecond", policies(sw("window", "window: 1.0000001s")), []string{`policy "sw"`, "window: core: invalid policy", "finer than a microsecond"}, true},
		{"too large", policies(tbPolicy) + "#" + strings.Repeat("x", MaxSize), []string{"larger than"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(strings.NewReader(tt.src))
			if err == nil {
				t.Fatalf("accepted %+v\n%s", c, tt.src)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "config: ") {
				t.Errorf("error %q does not start with the package", msg)
			}
			rest := msg
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error %q lacks %q", msg, w)
				}
				rest = rest[i+len(w):]
			}
			if got := errors.Is(err, core.ErrInvalidPolicy); got != tt.invalid {
				t.Errorf("errors.Is(%q, core.ErrInvalidPolicy) = %v, want %v", msg, got, tt.invalid)
			}
		})
	}
}

// TestLoadWithoutRoutes: a service that routes itself keeps only its limits
// in the config; path and key may be left out.
func TestLoadWithoutRoutes(t *testing.T) {
	c, err := Load(strings.NewReader(`
policies:
  - {name: burst, algorithm: token_bucket, capacity: 10, refill_per_second: 10}
  - {name: daily, algorithm: sliding_window, limit: 1000, window: 24h, outage: fail_closed}
  - {name: search, path: /search, algorithm: sliding_window, limit: 5, window: 1s, key: "query:api_key"}
  - {name: other, path: /other, algorithm: sliding_window, limit: 5, window: 1s, key: "cookie:session"}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, 0, len(c.Policies))
	for _, p := range c.Policies {
		got = append(got, p.Name+" "+p.Path+" "+p.Key.String()+" "+fmt.Sprint(p.Key.IsZero()))
	}
	want := []string{"burst   true", "daily   true", "search /search query:api_key false", "other /other cookie:session false"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if r := c.Policies[0].Rule(); r.Key != nil || r.Policy != c.Policies[0].Policy || r.Outage != httplimit.FailOpen {
		t.Errorf("burst: rule %+v, want no key and fail open", r)
	}
	if r := c.Policies[1].Rule(); r.Outage != httplimit.FailClosed {
		t.Errorf("daily: rule outage %v, want fail_closed", r.Outage)
	}
}

func TestClientIPBlock(t *testing.T) {
	tests := []struct {
		src  string
		want httplimit.IPOptions
	}{
		{"", httplimit.IPOptions{}},
		{"client_ip:\n", httplimit.IPOptions{}},
		{"trust_proxy: true\n", httplimit.IPOptions{TrustedProxies: 1}},
		{"trust_proxy: false\n", httplimit.IPOptions{}},
		{"client_ip: {trusted_proxies: 2, header: Forwarded, ipv6_prefix: 56, ipv4_prefix: 24}\n", httplimit.IPOptions{TrustedProxies: 2, Forwarded: true, IPv6Prefix: 56, IPv4Prefix: 24}},
		{"client_ip: {header: x-forwarded-for, ipv6_prefix: 128}\n", httplimit.IPOptions{IPv6Prefix: 128}},
	}
	for _, tt := range tests {
		c, err := Load(strings.NewReader(tt.src + policies(tbPolicy, swPolicy)))
		if err != nil {
			t.Errorf("%q: %v", tt.src, err)
			continue
		}
		// Only the ip key takes the options.
		if c.Policies[1].Key.IP != tt.want || c.Policies[0].Key.IP != (httplimit.IPOptions{}) {
			t.Errorf("%q: ip options %+v (header key %+v), want %+v", tt.src, c.Policies[1].Key.IP, c.Policies[0].Key.IP, tt.want)
		}
	}
}

func TestLoadEdges(t *testing.T) {
	// The largest token bucket core accepts: capacity 1e9 at one token a
	// second is 1e15 µs of credit, under tokenbucket.MaxCredit.
	if _, err := Load(strings.NewReader(policies(tb("capacity", "capacity: 1000000000")))); err != nil {
		t.Errorf("capacity 1e9: %v", err)
	}
	// Past MaxCredit: the constructor's product check, blamed on capacity.
	_, err := Load(strings.NewReader(policies(edit(tb("capacity", "capacity: 1000000000"), "refill_per_second", "refill_per_second: 0.5"))))
	if err == nil || !strings.Contains(err.Error(), `policy "tb": capacity: core: invalid policy`) {
		t.Errorf("capacity 1e9 at 0.5/s: %v", err)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Policy != "tb" || fe.Field != "capacity" || fe.Index != 0 {
		t.Errorf("FieldError %+v", fe)
	}
	// Anchors and aliases resolve.
	if _, err := Load(strings.NewReader("x: 1\n")); err == nil {
		t.Error("unknown field x accepted")
	}
	c, err := Load(strings.NewReader(policies(tb("path", "path: &p /api/tb"), sw("path", "path: /api/sw"))))
	if err != nil || c.Policies[0].Path != "/api/tb" {
		t.Errorf("anchored path: %v", err)
	}
}

func TestValidate(t *testing.T) {
	p, _ := tokenbucket.Policy("tb", 20, 5)
	key, _ := ParseKeySource("ip")
	good := Policy{Name: "tb", Path: "/tb", Policy: p, Key: key}
	tests := []struct {
		name string
		c    Config
		want string
	}{
		{"valid", Config{Policies: []Policy{good}}, ""},
		{"no policies", Config{}, "config: policies: empty"},
		{"zero policy", Config{Policies: []Policy{{Name: "x", Path: "/x", Key: key}}}, `config: policy "x": zero core.Policy`},
		{"name differs", Config{Policies: []Policy{{Name: "x", Path: "/x", Policy: p, Key: key}}}, `config: policy "x": name: "x" differs`},
		{"no key, no path", Config{Policies: []Policy{{Name: "tb", Policy: p}}}, ""},
		{"bad path", Config{Policies: []Policy{{Name: "tb", Path: "x", Policy: p}}}, `config: policy "tb": path: must start with '/'`},
		{"bad ip options", Config{Policies: []Policy{{Name: "tb", Policy: p, Key: KeySource{kind: ipKey, IP: httplimit.IPOptions{IPv6Prefix: 200}}}}}, `config: policy "tb": key: client_ip: ipv6_prefix: want 1 to 128, got 200`},
		{"bad outage", Config{Policies: []Policy{{Name: "tb", Path: "/x", Policy: p, Key: key, Outage: 7}}}, `config: policy "tb": outage: unknown mode 7`},
		{"bad prefix", Config{Prefix: "a}", Policies: []Policy{good}}, "config: prefix:"},
	}
	for _, tt := range tests {
		err := tt.c.Validate()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.want)) {
			t.Errorf("%s: Validate() = %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestRoutes: policies sharing a path and key make one route that charges
// them together, in file order; fail_closed on any makes the route's.
func TestRoutes(t *testing.T) {
	src := policies(tbPolicy, edit(edit(sw("path", "path: /api/tb"), "key", "key: header:X-Client-ID"), "outage", "outage: fail_closed"), swPolicy)
	src = strings.Replace(src, "name: sw\n", "name: sw2\n", 1)
	cfg, err := Load(strings.NewReader(src))
	if err != nil {
		t.Fatalf("%v\n%s", err, src)
	}
	rs := cfg.Routes()
	if len(rs) != 2 || rs[0].Path != "/api/tb" || rs[0].Rule.Policy.Name() != "tb" || len(rs[0].Rule.Also) != 1 || rs[0].Rule.Also[0].Name() != "sw2" ||
		rs[0].Rule.Outage != httplimit.FailClosed || rs[1].Path != "/api/sw" || len(rs[1].Rule.Also) != 0 {
		t.Fatalf("routes %+v", rs)
	}
}
