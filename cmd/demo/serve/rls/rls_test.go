package rls_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/serve/rls"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
)

func load(t *testing.T, src string) *rls.Config {
	t.Helper()
	c, err := rls.Load([]byte(src), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func d(kv ...string) rls.Descriptor {
	var es []rls.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, rls.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return rls.Descriptor{Entries: es}
}

// match is what one descriptor matched: the policy's name and its numbers,
// or "" for none.
func match(t *testing.T, c *rls.Config, domain string, desc rls.Descriptor) (string, *rls.Limit, string) {
	t.Helper()
	items, _, err := c.Plan(domain, []rls.Descriptor{desc}, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := items[0].Limit
	if l == nil {
		return "", nil, ""
	}
	name := "unlimited"
	if l.Policy.Valid() {
		name = l.Policy.Name()
	} else if !l.Unlimited {
		name = "zero"
	}
	return name, l, items[0].Key
}

// TestReadmeExamples loads envoyproxy/ratelimit's README examples (retyped
// as testdata/readme) from their directory and matches the descriptors the
// README describes: the limit each lands on, as the README says.
func TestReadmeExamples(t *testing.T) {
	c, err := rls.LoadPath("testdata/readme")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), " "); got != "edge_proxy_per_ip example10 example11 example4 example4_shallow example6 example7 example8 example9 internal messaging mongo_cps" {
		t.Errorf("domains %s", got)
	}
	tests := []struct {
		domain string
		desc   rls.Descriptor
		policy string // "" no limit, "unlimited", "zero"
		rpu    uint32
		unit   rls.Unit
		shadow bool
	}{
		{"mongo_cps", d("database", "users"), "mongo_cps.database_users", 500, rls.Second, false},
		{"mongo_cps", d("database", "default"), "mongo_cps.database_default", 500, rls.Second, false},
		{"mongo_cps", d("database", "orders"), "", 0, 0, false}, // no default for the key
		{"messaging", d("message_type", "marketing", "to_number", "2061111111"), "messaging.message_type_marketing.to_number", 5, rls.Day, false},
		{"messaging", d("to_number", "2061111111"), "messaging.to_number", 100, rls.Day, false},
		{"messaging", d("message_type", "marketing"), "", 0, 0, false}, // a placeholder without a limit
		{"messaging", d("message_type", "transactional", "to_number", "1"), "", 0, 0, false},
		{"edge_proxy_per_ip", d("remote_address", "50.0.0.1"), "edge_proxy_per_ip.remote_address", 10, rls.Second, false},
		{"edge_proxy_per_ip", d("remote_address", "50.0.0.5"), "zero", 0, rls.Second, false},
		{"example4", d("key", "value", "subkey", "subvalue"), "example4.key_value.subkey", 300, rls.Second, false},
		{"example4_shallow", d("key", "value", "subkey", "subvalue"), "", 0, 0, false},
		{"example4_shallow", d("key", "value"), "example4_shallow.key_value", 300, rls.Second, false},
		{"internal", d("ldap", "x"), "unlimited", 0, 0, false},
		{"internal", d("azure", "x"), "internal.azure", 100, rls.Minute, false},
		{"example6", d("service", "auth-service", "user", "user-a"), "example6.service.user_user-a", 10, rls.Second, true},
		{"example6", d("service", "auth-service", "user", "user-b"), "example6.service.user_user-b", 20, rls.Second, false},
		{"example6", d("service", "auth-service", "user", "user-c"), "", 0, 0, false},
		{"example8", d("key1", "unspecified_value"), "example8.key1", 10, rls.Minute, false},
		{"example8", d("key1", "value1"), "example8.key1_value1", 20, rls.Minute, false},
		{"example9", d("key1", "value1"), "example9.key1_value_-", 20, rls.Minute, false},
		{"example9", d("key1", "valueXYZ"), "example9.key1_value_-", 20, rls.Minute, false},
		{"example9", d("key1", "valu"), "", 0, 0, false},
		{"example9", d("path", "/api/123/action"), "example9.path__api___action-", 20, rls.Minute, false},
		{"example9", d("path", "/api/user-id/action"), "example9.path__api___action-", 20, rls.Minute, false},
		{"example9", d("path", "/api/123/other"), "", 0, 0, false},
		{"example9", d("route", "/api/v1/resource/123/action"), "example9.route__api___resource___action-", 20, rls.Minute, false},
		{"example9", d("route", "/api/v1/resource/123/other"), "", 0, 0, false},
		{"example10", d("route", "api", "http_method", "GET", "subject_id", "123"), "example10.route.http_method.subject_id", 60, rls.Minute, false},
		{"example11", d("files", "files/a.pdf"), "example11.files_files__-", 10, rls.Hour, false},
		{"example11", d("files_no_share", "files_no_share/a.pdf"), "example11.files_no_share_files_no_share__-", 10, rls.Hour, false},
	}
	for _, tt := range tests {
		name, l, _ := match(t, c, tt.domain, tt.desc)
		if !strings.HasPrefix(name, tt.policy) || (tt.policy == "") != (name == "") {
			t.Errorf("%s %v: matched %q, want %q", tt.domain, tt.desc.Entries, name, tt.policy)
			continue
		}
		if l != nil && (l.RequestsPerUnit != tt.rpu || l.Unit != tt.unit || l.ShadowMode != tt.shadow) {
			t.Errorf("%s %v: %d per %v shadow %v, want %d per %v shadow %v", tt.domain, tt.desc.Entries, l.RequestsPerUnit, l.Unit, l.ShadowMode, tt.rpu, tt.unit, tt.shadow)
		}
		if l != nil && l.Policy.Valid() {
			// The default algorithm: a token bucket of requests_per_unit
			// refilled at requests_per_unit per unit.
			if l.Policy.Algorithm().Name() != rls.DefaultAlgorithm || l.Policy.Limit() != int64(tt.rpu) ||
				l.Policy.Interval() != (tt.unit.Duration()/time.Duration(tt.rpu)).Round(time.Microsecond) {
				t.Errorf("%s: policy %v", name, l.Policy)
			}
		}
	}

	// Example 7: the limit named specific_limit is dropped from a request
	// that also matches the one replacing it, and only there.
	items, _, err := c.Plan("example7", []rls.Descriptor{d("key_1", "value_1", "user", "bkthomps"), d("key_2", "value_2", "user", "bkthomps")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if items[0].Limit != nil || !items[0].Replaced || items[1].Limit == nil || items[1].Limit.RequestsPerUnit != 10 {
		t.Errorf("example7 both: %+v %+v", items[0], items[1])
	}
	if name, l, _ := match(t, c, "example7", d("key_1", "value_1", "user", "bkthomps")); l == nil || l.RequestsPerUnit != 5 || l.Name != "specific_limit" {
		t.Errorf("example7 alone: %s %+v", name, l)
	}

	// Example 11: shared wildcard matches share one key; unshared ones each
	// have their own.
	_, _, ka := match(t, c, "example11", d("files", "files/a.pdf"))
	_, _, kb := match(t, c, "example11", d("files", "files/b.csv"))
	_, _, na := match(t, c, "example11", d("files_no_share", "files_no_share/a.pdf"))
	_, _, nb := match(t, c, "example11", d("files_no_share", "files_no_share/b.csv"))
	if ka != kb || na == nb || ka != "7:files/*" {
		t.Errorf("share_threshold keys %q %q, unshared %q %q", ka, kb, na, nb)
	}
}

func TestPlanCostsAndKeys(t *testing.T) {
	c := load(t, `domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10}
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window_counter, outage: fail_closed}
`)
	zero, seven := uint64(0), uint64(7)
	items, known, err := c.Plan("d", []rls.Descriptor{d("a", "x"), {Entries: d("a", "x", "b", "y").Entries, Hits: &zero}, {Entries: d("a", "x:1").Entries, Hits: &seven}}, 3)
	if err != nil || !known {
		t.Fatal(known, err)
	}
	if items[0].Cost != 3 || items[1].Cost != 0 || items[2].Cost != 7 {
		t.Errorf("costs %d %d %d, want the request's 3, the descriptor's 0 and 7", items[0].Cost, items[1].Cost, items[2].Cost)
	}
	if items[0].Key != "1:x" || items[1].Key != "1:x1:y" || items[2].Key != "3:x:1" {
		t.Errorf("keys %q %q %q", items[0].Key, items[1].Key, items[2].Key)
	}
	if l := items[1].Limit; l.Policy.Algorithm().Name() != "sliding_window_counter" || l.Outage != fallback.FailClosed || l.KeyPath != "a.b" {
		t.Errorf("nested limit %+v", l)
	}
	if m := c.OutageModes(); len(m) != 2 || m["d.a.b"] != fallback.FailClosed || m["d.a"] != fallback.Leases {
		t.Errorf("outage modes %v", m)
	}
	items, known, err = c.Plan("nope", []rls.Descriptor{d("a", "x")}, 0)
	if err != nil || known || items[0].Limit != nil || items[0].Cost != 1 {
		t.Errorf("unknown domain: %+v %v %v", items, known, err)
	}
}

func TestPlanRejectsMalformed(t *testing.T) {
	c := load(t, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	long := strings.Repeat("v", rls.MaxEntryLen+1)
	many := make([]rls.Descriptor, rls.MaxDescriptors+1)
	for i := range many {
		many[i] = d("a", "x")
	}
	deep := rls.Descriptor{}
	for range rls.MaxEntries + 1 {
		deep.Entries = append(deep.Entries, rls.Entry{Key: "a", Value: "x"})
	}
	tests := []struct {
		domain string
		descs  []rls.Descriptor
		want   string
	}{
		{"", []rls.Descriptor{d("a", "x")}, "empty domain"},
		{"d", nil, "no descriptors"},
		{"d", []rls.Descriptor{{}}, "descriptor 0 has no entries"},
		{"d", []rls.Descriptor{d("a", "x"), d("", "x")}, "descriptor 1 entry 0 has an empty key"},
		{"d", []rls.Descriptor{d("a", long)}, "longer than 256 bytes"},
		{"d", []rls.Descriptor{d(long, "x")}, "longer than 256 bytes"},
		{"d", many, "65 descriptors, at most 64"},
		{"d", []rls.Descriptor{deep}, "17 entries, at most 16"},
		{strings.Repeat("d", 300), []rls.Descriptor{d("a", "x")}, "domain of 300 bytes"},
	}
	for _, tt := range tests {
		_, _, err := c.Plan(tt.domain, tt.descs, 0)
		var re *rls.RequestError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%.20s %d descriptors: %v, want a RequestError with %q", tt.domain, len(tt.descs), err, tt.want)
		}
	}
}

func TestLoadErrorsNameTheField(t *testing.T) {
	tests := []struct{ src, want string }{
		{"", `rls: test.yaml: domain: empty config`},
		{"descriptors: []", `domain: required`},
		{"domain: d\nlimits: []", `test.yaml: limits: unknown field (want domain, descriptors, algorithm or outage)`},
		{"domain: d\ndescriptors:\n  - value: x", `descriptors[0].key: required`},
		{"domain: d\ndescriptors:\n  - key: a\n    unit: second", `descriptors[0].unit: unknown field`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", `descriptors[0].rate_limit.unit: want second, minute, hour, day, week, month or year, got "fortnight"`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}", `descriptors[0].rate_limit.requests_per_unit: required`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}", `requests_per_unit: want an integer from 0 to 4294967295, got "-1"`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1.5}", `got "1.5"`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2000000}", `descriptors[0].rate_limit.requests_per_unit: 2000000 per second with token_bucket: refill rate 2e+06 per second is above 1e6 per second`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 20000, algorithm: sliding_window_counter}", `descriptors[0].rate_limit.requests_per_unit: 20000 per day with sliding_window_counter`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}", `descriptors[0].rate_limit.unit: not with unlimited: true`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}", `rate_limit.algorithm: want token_bucket, sliding_window or sliding_window_counter, got "gcra"`},
		{"domain: d\noutage: sometimes\ndescriptors: []", `outage: want leases, fail_open or fail_closed, got "sometimes"`},
		{"domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes please", `descriptors[0].shadow_mode: want true or false`},
		{"domain: d\ndescriptors:\n  - key: a\n    quota_mode: true", `descriptors[0].quota_mode: not supported by holdfast`},
		{"domain: d\ndescriptors:\n  - key: a\n    share_threshold: true", `descriptors[0].share_threshold: only for a wildcard value`},
		{"domain: d\ndescriptors:\n  - key: a\n  - key: a", `descriptors[1]: key "a" with value "" is given twice`},
		{"domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        value: c\n      - key: b\n        value: c", `descriptors[0].descriptors[1]: key "b" with value "c" is given twice`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: n, replaces: [{name: n}], unit: second, requests_per_unit: 1}", `replaces[0].name: a limit cannot replace itself`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {replaces: [{}], unit: second, requests_per_unit: 1}", `replaces[0].name: required`},
		{"domain: d\ndescriptors: {key: a}", `descriptors: want a list of descriptors`},
		{"domain: d\n---\ndomain: e", `more than one YAML document`},
		{"domain: [d]", `domain: want a single value`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, outage: fail_closed}\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1, shadow: true}", `descriptors[0].descriptors[0].rate_limit.shadow: unknown field`},
	}
	for _, tt := range tests {
		_, err := rls.Load([]byte(tt.src), "test.yaml")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q:\n  error %v\n  want  %q", tt.src, err, tt.want)
		}
	}
	// Numbers a policy cannot have wrap core.ErrInvalidPolicy.
	_, err := rls.Load([]byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2000000}"), "x")
	if !errors.Is(err, core.ErrInvalidPolicy) {
		t.Errorf("%v does not wrap ErrInvalidPolicy", err)
	}
}

func TestLoadPathDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		if err := writeFile(dir+"/"+name, src); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("notes.txt", "not a config")
	if c, err := rls.LoadPath(dir); err != nil || strings.Join(c.Domains(), ",") != "a" {
		t.Fatalf("%v %v", c, err)
	}
	write("b.yml", "domain: a\ndescriptors: []\n")
	if _, err := rls.LoadPath(dir); err == nil || !strings.Contains(err.Error(), `b.yml: domain "a": domain: already loaded from`) {
		t.Errorf("a domain in two files: %v", err)
	}
}

// TestPolicyNames: names are valid policy names, readable when the path
// allows, unique when sanitising or cutting would make two equal.
func TestPolicyNames(t *testing.T) {
	long := strings.Repeat("k", 80)
	c := load(t, `domain: d
descriptors:
  - key: path
    value: /a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: _a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: `+long+`
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	seen := map[string]bool{}
	for _, l := range c.Limits() {
		n := l.Policy.Name()
		if err := driver.CheckPolicyName(n); err != nil || seen[n] {
			t.Errorf("name %q: %v, seen %v", n, err, seen[n])
		}
		seen[n] = true
	}
	if !seen["d.path__a"] || len(seen) != 3 {
		t.Errorf("names %v", seen)
	}
}
