package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseKeySource(t *testing.T) {
	tests := []struct {
		in, str, header string
		ok              bool
	}{
		{"header:X-Client-ID", "header:X-Client-ID", "X-Client-Id", true},
		{"header:x-api-key", "header:x-api-key", "X-Api-Key", true},
		{"ip", "ip", "", true},
		{"", "", "", false},
		{"IP", "", "", false},
		{"header:", "", "", false},
		{"header:X Client", "", "", false},
		{"header:a:b", "", "", false},
		{"header:é", "", "", false},
		{"cookie:session", "", "", false},
	}
	for _, tt := range tests {
		k, err := ParseKeySource(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseKeySource(%q) error %v, want ok %v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && (k.String() != tt.str || k.Header() != tt.header) {
			t.Errorf("ParseKeySource(%q) = %s (header %q), want %s (%q)", tt.in, k, k.Header(), tt.str, tt.header)
		}
	}
}

func hashed(s string) string {
	sum := sha256.Sum256([]byte(s))
	return HashPrefix + hex.EncodeToString(sum[:])
}

func TestExtract(t *testing.T) {
	hdr, _ := ParseKeySource("header:X-Client-ID")
	ip, _ := ParseKeySource("ip")
	proxied := ip
	proxied.TrustProxy = true
	long := strings.Repeat("k", MaxVerbatimKeyLen)
	tests := []struct {
		name   string
		src    KeySource
		remote string
		header map[string][]string
		want   string
		err    string // substring of the error; "" for none
		keyErr bool   // the error is a *KeyError (the client's fault)
	}{
		{"header", hdr, "", map[string][]string{"X-Client-Id": {"client-42"}}, "client-42", "", false},
		{"header first value", hdr, "", map[string][]string{"X-Client-Id": {"a", "b"}}, "a", "", false},
		{"header trimmed", hdr, "", map[string][]string{"X-Client-Id": {"  a b \t"}}, "a b", "", false},
		{"header missing", hdr, "", nil, "", "missing header X-Client-ID", true},
		{"header empty", hdr, "", map[string][]string{"X-Client-Id": {""}}, "", "missing header X-Client-ID", true},
		{"header blank", hdr, "", map[string][]string{"X-Client-Id": {" \t "}}, "", "missing header X-Client-ID", true},
		{"key of MaxVerbatimKeyLen bytes", hdr, "", map[string][]string{"X-Client-Id": {long}}, long, "", false},
		{"key over MaxVerbatimKeyLen hashed", hdr, "", map[string][]string{"X-Client-Id": {long + "k"}}, hashed(long + "k"), "", false},
		{"control byte hashed", hdr, "", map[string][]string{"X-Client-Id": {"a\x00b"}}, hashed("a\x00b"), "", false},
		{"non-ASCII hashed", hdr, "", map[string][]string{"X-Client-Id": {"clé"}}, hashed("clé"), "", false},
		{"hash prefix hashed", hdr, "", map[string][]string{"X-Client-Id": {"sha256:00"}}, hashed("sha256:00"), "", false},

		{"ip", ip, "192.0.2.1:1234", nil, "192.0.2.1", "", false},
		{"ipv6", ip, "[2001:db8::1]:80", nil, "2001:db8::1", "", false},
		{"ipv4-mapped", ip, "[::ffff:192.0.2.1]:80", nil, "192.0.2.1", "", false},
		{"zone dropped", ip, "[fe80::1%eth0]:80", nil, "fe80::1", "", false},
		{"proxy headers ignored", ip, "192.0.2.1:1", map[string][]string{"X-Forwarded-For": {"203.0.113.9"}, "X-Real-Ip": {"203.0.113.8"}}, "192.0.2.1", "", false},
		{"bad peer address", ip, "@", nil, "", "peer address", false},
		{"forwarded: last address", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"203.0.113.9, 198.51.100.2"}}, "198.51.100.2", "", false},
		{"forwarded: last field", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"203.0.113.9", "198.51.100.3"}}, "198.51.100.3", "", false},
		{"forwarded: with port", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"[2001:db8::2]:443"}}, "2001:db8::2", "", false},
		{"forwarded: not an address", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"1.2.3.4, unknown"}}, "", "X-Forwarded-For", true},
		{"real ip", proxied, "10.0.0.1:1", map[string][]string{"X-Real-Ip": {"198.51.100.4"}}, "198.51.100.4", "", false},
		{"real ip not an address", proxied, "10.0.0.1:1", map[string][]string{"X-Real-Ip": {"me"}}, "", "X-Real-IP", true},
		{"no proxy headers", proxied, "10.0.0.1:1", nil, "10.0.0.1", "", false},

		{"zero source", KeySource{}, "", nil, "", "zero KeySource", false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tt.remote
		for k, v := range tt.header {
			r.Header[k] = v
		}
		got, err := tt.src.Extract(r)
		if tt.err == "" {
			if err != nil || got != tt.want {
				t.Errorf("%s: Extract = %q, %v; want %q", tt.name, got, err, tt.want)
			}
			continue
		}
		var ke *KeyError
		if err == nil || !strings.Contains(err.Error(), tt.err) || errors.As(err, &ke) != tt.keyErr {
			t.Errorf("%s: Extract = %q, %v; want an error with %q (KeyError %v)", tt.name, got, err, tt.err, tt.keyErr)
		}
	}
}
