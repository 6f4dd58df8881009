package config

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
)

// encodedPolicy and encodedConfig write a Config back as YAML.
type encodedPolicy struct {
	Name      string  `yaml:"name"`
	Path      string  `yaml:"path,omitempty"`
	Algorithm string  `yaml:"algorithm"`
	Capacity  int64   `yaml:"capacity,omitempty"`
	Refill    float64 `yaml:"refill_per_second,omitempty"`
	Limit     int64   `yaml:"limit,omitempty"`
	Window    string  `yaml:"window,omitempty"`
	Key       string  `yaml:"key,omitempty"`
	Outage    string  `yaml:"outage"`
}

type encodedIP struct {
	TrustedProxies int    `yaml:"trusted_proxies,omitempty"`
	Header         string `yaml:"header,omitempty"`
	IPv6Prefix     int    `yaml:"ipv6_prefix,omitempty"`
	IPv4Prefix     int    `yaml:"ipv4_prefix,omitempty"`
}

type encodedConfig struct {
	Prefix   string          `yaml:"prefix,omitempty"`
	ClientIP *encodedIP      `yaml:"client_ip,omitempty"`
	Policies []encodedPolicy `yaml:"policies"`
}

func encode(t *testing.T, c *Config) []byte {
	e := encodedConfig{Prefix: c.Prefix}
	for _, p := range c.Policies {
		ep := encodedPolicy{Name: p.Name, Path: p.Path, Algorithm: p.Policy.Algorithm().Name(), Key: p.Key.String(), Outage: p.Outage.String()}
		if ep.Algorithm == tokenbucket.Name {
			ep.Capacity = p.Policy.Limit()
			// Rate is the rate the rounded interval enforces; it parses
			// back to the same interval.
			ep.Refill = tokenbucket.Rate(p.Policy)
		} else {
			ep.Limit, ep.Window = p.Policy.Limit(), p.Policy.Interval().String()
		}
		if ip := p.Key.IP; p.Key.kind == ipKey {
			e.ClientIP = &encodedIP{TrustedProxies: ip.TrustedProxies, IPv6Prefix: ip.IPv6Prefix, IPv4Prefix: ip.IPv4Prefix}
			if ip.Forwarded {
				e.ClientIP.Header = "forwarded"
			}
		}
		e.Policies = append(e.Policies, ep)
	}
	out, err := yaml.Marshal(e)
	if err != nil {
		t.Fatalf("encode %+v: %v", c, err)
	}
	return out
}

// FuzzLoad checks that Load never panics, that every error names the
// package, and that an accepted config validates and survives being written
// back and loaded again.
func FuzzLoad(f *testing.F) {
	demo, err := os.ReadFile("testdata/demo.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(demo))
	f.Add(policies(tbPolicy, swPolicy))
	f.Add("trust_proxy: true\nprefix: x\n" + policies(sw("", "outage: fail_open")))
	f.Add("client_ip: {trusted_proxies: 2, header: forwarded, ipv6_prefix: 56}\n" + policies(sw("path", ""), tb("key", "key: cookie:s")))
	f.Add(policies(tb("key", ""), sw("key", "key: query:k")))
	f.Add(policies(tb("refill_per_second", "refill_per_second: -1")))
	f.Add(policies(sw("", "capacity: 3")))
	f.Add(policies(tbPolicy, tbPolicy))
	f.Add(policies(tbPolicy) + "---\n")
	f.Add("policies: [{name: a, path: /a, algorithm: sliding_window, limit: .nan, window: 1s, key: ip}]")
	f.Add("policies:\n  - &a {name: x}\n  - *a\n")
	f.Fuzz(func(t *testing.T, src string) {
		c, err := Load(strings.NewReader(src))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config: ") {
				t.Fatalf("error %q does not start with the package", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config does not validate: %v\n%s", err, src)
		}
		again, err := Load(bytes.NewReader(encode(t, c)))
		if err != nil {
			t.Fatalf("written back config does not load: %v\n%s", err, encode(t, c))
		}
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("written back config differs:\n%+v\n%+v", c, again)
		}
	})
}
