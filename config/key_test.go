package config

import (
	"net/http/httptest"
	"testing"

	"github.com/holdfast/holdfast/httplimit"
)

func TestParseKeySource(t *testing.T) {
	tests := []struct {
		in, str, header string
		ok              bool
	}{
		{"header:X-Client-ID", "header:X-Client-ID", "X-Client-Id", true},
		{"header:x-api-key", "header:x-api-key", "X-Api-Key", true},
		{"cookie:session", "cookie:session", "", true},
		{"query:api_key", "query:api_key", "", true},
		{"query:user[id]", "query:user[id]", "", true},
		{"ip", "ip", "", true},
		{"", "", "", false},
		{"IP", "", "", false},
		{"header:", "", "", false},
		{"header:X Client", "", "", false},
		{"header:a:b", "", "", false},
		{"header:é", "", "", false},
		{"cookie:", "", "", false},
		{"cookie:a=b", "", "", false},
		{"query:", "", "", false},
		{"query:a b", "", "", false},
		{"query:a&b", "", "", false},
		{"query:a%20", "", "", false},
		{"body:id", "", "", false},
	}
	for _, tt := range tests {
		k, err := ParseKeySource(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseKeySource(%q) error %v, want ok %v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && (k.String() != tt.str || k.Header() != tt.header || k.IsZero()) {
			t.Errorf("ParseKeySource(%q) = %s (header %q, zero %v), want %s (%q)", tt.in, k, k.Header(), k.IsZero(), tt.str, tt.header)
		}
	}
	if k := (KeySource{}); !k.IsZero() || k.String() != "" || k.KeyFunc() != nil {
		t.Errorf("zero KeySource: zero %v, %q, func %v", k.IsZero(), k, k.KeyFunc() != nil)
	}
}

// TestKeyFunc: each source's KeyFunc reads what it names; an ip source
// applies its options.
func TestKeyFunc(t *testing.T) {
	r := httptest.NewRequest("GET", "/?api_key=q-1", nil)
	r.RemoteAddr = "10.0.0.2:5000"
	r.Header.Set("X-Client-ID", "h-1")
	r.Header.Set("Cookie", "session=c-1")
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 2001:db8:1:2::9")
	proxied, _ := ParseKeySource("ip")
	proxied.IP = httplimit.IPOptions{TrustedProxies: 1, IPv6Prefix: 48}
	for src, want := range map[string]string{
		"header:X-Client-ID": "h-1",
		"cookie:session":     "c-1",
		"query:api_key":      "q-1",
		"ip":                 "10.0.0.2",
	} {
		k, _ := ParseKeySource(src)
		if got, err := k.KeyFunc()(r); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", src, got, err, want)
		}
	}
	if got, err := proxied.KeyFunc()(r); err != nil || got != "2001:db8:1::/48" {
		t.Errorf("ip behind a proxy: %q, %v; want 2001:db8:1::/48", got, err)
	}
}
