package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http/httptest"
	"net/textproto"
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
	Path      string  `yaml:"path"`
	Algorithm string  `yaml:"algorithm"`
	Capacity  int64   `yaml:"capacity,omitempty"`
	Refill    float64 `yaml:"refill_per_second,omitempty"`
	Limit     int64   `yaml:"limit,omitempty"`
	Window    string  `yaml:"window,omitempty"`
	Key       string  `yaml:"key"`
	Outage    string  `yaml:"outage"`
}

type encodedConfig struct {
	Prefix     string          `yaml:"prefix,omitempty"`
	TrustProxy bool            `yaml:"trust_proxy,omitempty"`
	Policies   []encodedPolicy `yaml:"policies"`
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
		e.TrustProxy = e.TrustProxy || p.Key.TrustProxy
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

// FuzzExtract checks that a client key from a header, or an address from
// X-Forwarded-For, is always short printable ASCII, and that a key already
// so is kept as it is.
func FuzzExtract(f *testing.F) {
	for _, s := range []string{"client-42", "", " ", "a\x00b", "\r", "clé", "sha256:00", strings.Repeat("k", 129), "1.2.3.4, 5.6.7.8", "[::1]:80"} {
		f.Add(s)
	}
	hdr, _ := ParseKeySource("header:X-Client-ID")
	ip, _ := ParseKeySource("ip")
	ip.TrustProxy = true
	f.Fuzz(func(t *testing.T, v string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["X-Client-Id"] = []string{v}
		r.Header["X-Forwarded-For"] = []string{v}
		key, err := hdr.Extract(r)
		trimmed := textproto.TrimString(v)
		switch {
		case trimmed == "":
			if err == nil {
				t.Fatalf("blank header %q gave key %q", v, key)
			}
		case err != nil:
			t.Fatalf("header %q: %v", v, err)
		case len(trimmed) <= MaxVerbatimKeyLen && printable(trimmed) && !strings.HasPrefix(trimmed, HashPrefix):
			if key != trimmed {
				t.Fatalf("header %q gave key %q, want it unchanged", v, key)
			}
		default:
			sum := sha256.Sum256([]byte(trimmed))
			if key != HashPrefix+hex.EncodeToString(sum[:]) {
				t.Fatalf("header %q gave key %q, want its hash", v, key)
			}
		}
		if err == nil && (len(key) > MaxVerbatimKeyLen || !printable(key)) {
			t.Fatalf("unsafe key %q", key)
		}
		if key, err := ip.Extract(r); err == nil && (key == "" || len(key) > MaxVerbatimKeyLen || !printable(key)) {
			t.Fatalf("X-Forwarded-For %q gave unsafe key %q", v, key)
		}
	})
}
