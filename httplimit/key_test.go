package httplimit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/textproto"
	"strings"
	"testing"
)

// keyCase is one request for a KeyFunc: its peer address and header
// fields, the key it should give, or the error it should give ("" for
// none) and whether that is a *ClientError.
type keyCase struct {
	name   string
	remote string
	header http.Header
	want   string
	err    string
	client bool
}

func runKeyCases(t *testing.T, key KeyFunc, cases []keyCase) {
	t.Helper()
	for _, tt := range cases {
		r := httptest.NewRequest("GET", "/?api_key=q-1&empty=", nil)
		r.RemoteAddr = tt.remote
		for k, v := range tt.header {
			r.Header[k] = v
		}
		got, err := key(r)
		if tt.err == "" {
			if err != nil || got != tt.want {
				t.Errorf("%s: key %q, %v; want %q", tt.name, got, err, tt.want)
			}
			continue
		}
		_, client := errors.AsType[*ClientError](err)
		if err == nil || !strings.Contains(err.Error(), tt.err) || client != tt.client {
			t.Errorf("%s: key %q, %v; want an error with %q (ClientError %v)", tt.name, got, err, tt.err, tt.client)
		}
	}
}

func TestHeaderCookieQuery(t *testing.T) {
	runKeyCases(t, Header("x-client-id"), []keyCase{
		{name: "header", header: http.Header{"X-Client-Id": {"client-42"}}, want: "client-42"},
		{name: "first value", header: http.Header{"X-Client-Id": {"a", "b"}}, want: "a"},
		{name: "trimmed", header: http.Header{"X-Client-Id": {"  a b \t"}}, want: "a b"},
		{name: "missing", err: "httplimit: missing header x-client-id", client: true},
		{name: "blank", header: http.Header{"X-Client-Id": {" \t "}}, err: "missing header x-client-id", client: true},
	})
	runKeyCases(t, Cookie("session"), []keyCase{
		{name: "cookie", header: http.Header{"Cookie": {"theme=dark; session=s-42"}}, want: "s-42"},
		{name: "missing cookie", header: http.Header{"Cookie": {"theme=dark"}}, err: "missing cookie session", client: true},
		{name: "empty cookie", header: http.Header{"Cookie": {"session="}}, err: "missing cookie session", client: true},
	})
	runKeyCases(t, Query("api_key"), []keyCase{{name: "query", want: "q-1"}})
	runKeyCases(t, Query("empty"), []keyCase{{name: "empty query", err: "missing query parameter empty", client: true}})
	runKeyCases(t, Query("other"), []keyCase{{name: "missing query", err: "missing query parameter other", client: true}})
}

func TestClientIPGrouping(t *testing.T) {
	runKeyCases(t, ClientIP(IPOptions{}), []keyCase{
		{name: "ipv4", remote: "192.0.2.1:1234", want: "192.0.2.1"},
		{name: "ipv6 grouped by /64", remote: "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:80", want: "2001:db8:1:2::/64"},
		{name: "same /64, another address", remote: "[2001:db8:1:2::1]:80", want: "2001:db8:1:2::/64"},
		{name: "next /64", remote: "[2001:db8:1:3::1]:80", want: "2001:db8:1:3::/64"},
		{name: "ipv4-mapped", remote: "[::ffff:192.0.2.1]:80", want: "192.0.2.1"},
		{name: "zone dropped", remote: "[fe80::1%eth0]:80", want: "fe80::/64"},
		{name: "no port", remote: "192.0.2.9", want: "192.0.2.9"},
		{name: "proxy fields ignored", remote: "192.0.2.1:1", header: http.Header{"X-Forwarded-For": {"203.0.113.9"}, "Forwarded": {"for=203.0.113.8"}}, want: "192.0.2.1"},
		{name: "bad peer", remote: "@", err: `peer address "@"`},
	})
	runKeyCases(t, ClientIP(IPOptions{IPv6Prefix: 128, IPv4Prefix: 24}), []keyCase{
		{name: "ipv6 /128", remote: "[2001:db8:1:2::1]:80", want: "2001:db8:1:2::1"},
		{name: "ipv4 /24", remote: "192.0.2.77:80", want: "192.0.2.0/24"},
	})
	runKeyCases(t, ClientIP(IPOptions{IPv6Prefix: 48}), []keyCase{
		{name: "ipv6 /48", remote: "[2001:db8:1:2::1]:80", want: "2001:db8:1::/48"},
	})
}

// TestClientIPTrustedProxies: with a trust depth of n, the client is the
// n-th address from the end, whatever the client wrote before it.
func TestClientIPTrustedProxies(t *testing.T) {
	xff := func(v ...string) http.Header { return http.Header{"X-Forwarded-For": v} }
	const peer = "10.0.0.2:5000" // the proxy nearest to the service
	runKeyCases(t, ClientIP(IPOptions{TrustedProxies: 1}), []keyCase{
		{name: "one proxy", remote: peer, header: xff("203.0.113.7"), want: "203.0.113.7"},
		{name: "spoofed: the client wrote 6.6.6.6", remote: peer, header: xff("6.6.6.6, 203.0.113.7"), want: "203.0.113.7"},
		{name: "spoofed on its own line", remote: peer, header: xff("6.6.6.6", "203.0.113.7"), want: "203.0.113.7"},
		{name: "spoofed with an empty element", remote: peer, header: xff("6.6.6.6,, 203.0.113.7,"), want: "203.0.113.7"},
		{name: "ipv6 with port, grouped", remote: peer, header: xff("[2001:db8:1:2::9]:443"), want: "2001:db8:1:2::/64"},
		{name: "no field: the peer", remote: peer, want: "10.0.0.2"},
		{name: "blank field: the peer", remote: peer, header: xff(" , "), want: "10.0.0.2"},
		{name: "not an address", remote: peer, header: xff("1.2.3.4, unknown"), err: "X-Forwarded-For names no IP address", client: true},
		{name: "Forwarded ignored", remote: peer, header: http.Header{"Forwarded": {"for=203.0.113.8"}}, want: "10.0.0.2"},
	})
	runKeyCases(t, ClientIP(IPOptions{TrustedProxies: 2}), []keyCase{
		{name: "two proxies", remote: peer, header: xff("203.0.113.7, 10.0.0.1"), want: "203.0.113.7"},
		{name: "two proxies, spoofed", remote: peer, header: xff("6.6.6.6, 7.7.7.7, 203.0.113.7, 10.0.0.1"), want: "203.0.113.7"},
		{name: "shorter than the depth: the first", remote: peer, header: xff("203.0.113.7"), want: "203.0.113.7"},
		{name: "the client's own address is not trusted", remote: peer, header: xff("10.9.9.9, 203.0.113.7, 10.0.0.1"), want: "203.0.113.7"},
	})
	fwd := func(v ...string) http.Header { return http.Header{"Forwarded": v} }
	runKeyCases(t, ClientIP(IPOptions{TrustedProxies: 1, Forwarded: true}), []keyCase{
		{name: "forwarded", remote: peer, header: fwd("for=192.0.2.60;proto=http;by=203.0.113.43"), want: "192.0.2.60"},
		{name: "forwarded ipv6 quoted", remote: peer, header: fwd(`for="[2001:db8:cafe::17]:4711"`), want: "2001:db8:cafe::/64"},
		{name: "forwarded spoofed", remote: peer, header: fwd("for=6.6.6.6, For=192.0.2.61;proto=https"), want: "192.0.2.61"},
		{name: "forwarded comma in a quoted string", remote: peer, header: fwd(`for=6.6.6.6, by="a,b";for=192.0.2.62`), want: "192.0.2.62"},
		{name: "forwarded escaped quote", remote: peer, header: fwd(`for=192.0.2.63;ext="x\",y"`), want: "192.0.2.63"},
		{name: "forwarded unknown", remote: peer, header: fwd("for=unknown"), err: "Forwarded names no IP address", client: true},
		{name: "forwarded obfuscated", remote: peer, header: fwd("for=_hidden"), err: "Forwarded names no IP address", client: true},
		{name: "forwarded without for", remote: peer, header: fwd("proto=https"), err: "Forwarded names no IP address", client: true},
		{name: "X-Forwarded-For ignored", remote: peer, header: xff("203.0.113.9"), want: "10.0.0.2"},
	})
}

func TestClientIPPanics(t *testing.T) {
	for _, o := range []IPOptions{{TrustedProxies: -1}, {IPv6Prefix: 129}, {IPv6Prefix: -1}, {IPv4Prefix: 33}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("ClientIP(%+v) did not panic", o)
				}
			}()
			ClientIP(o)
		}()
	}
}

// TestSpoofedForwardedForSharesABucket: behind one trusted proxy, a client
// that writes a new X-Forwarded-For on every request still spends one
// bucket: 3 of 5 admitted at capacity 3.
func TestSpoofedForwardedForSharesABucket(t *testing.T) {
	lim, _ := memLimiter(t)
	h := New(lim, Rule{Policy: mustTB(t, "tb", 3, 1), Key: ClientIP(IPOptions{TrustedProxies: 1})})(http.HandlerFunc(AllowedJSON))
	var codes []int
	for i := range 5 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.2:5000"
		r.Header.Set("X-Forwarded-For", "198.51.100."+itoa(int64(i))+", 203.0.113.7")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes = append(codes, w.Code)
	}
	if got := joinInts(codes); got != "200 200 200 429 429" {
		t.Errorf("codes %s, want 200 200 200 429 429", got)
	}
}

func joinInts(ns []int) string {
	var b strings.Builder
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(itoa(int64(n)))
	}
	return b.String()
}

func TestSafeKey(t *testing.T) {
	hashed := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return HashPrefix + hex.EncodeToString(sum[:])
	}
	long := strings.Repeat("k", MaxVerbatimKeyLen)
	for in, want := range map[string]string{
		"client-42":  "client-42",
		long:         long,
		long + "k":   hashed(long + "k"),
		"a\x00b":     hashed("a\x00b"),
		"clé":        hashed("clé"),
		"sha256:00":  hashed("sha256:00"),
		"a b ~":      "a b ~",
		"2001:db8::": "2001:db8::",
	} {
		if got := SafeKey(in); got != want {
			t.Errorf("SafeKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzKeys checks that a header key made safe is short printable ASCII
// (the value itself when it already was), and that ClientIP behind proxies
// never panics and gives an address or a prefix, whatever the client puts
// in X-Forwarded-For and Forwarded.
func FuzzKeys(f *testing.F) {
	for _, s := range []string{"client-42", "", " ", "a\x00b", "\r", "clé", "sha256:00", strings.Repeat("k", 129),
		"1.2.3.4, 5.6.7.8", "[::1]:80", `for="[2001:db8::1]:80";proto=https, for=1.2.3.4`, `for="a,b`, `"\`, ",,,"} {
		f.Add(s)
	}
	hdr := Header("X-Client-ID")
	var ips []KeyFunc
	for _, o := range []IPOptions{{TrustedProxies: 1}, {TrustedProxies: 3, IPv6Prefix: 56}, {TrustedProxies: 1, Forwarded: true}, {TrustedProxies: 2, Forwarded: true, IPv4Prefix: 24}} {
		ips = append(ips, ClientIP(o))
	}
	f.Fuzz(func(t *testing.T, v string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.2:5000"
		r.Header["X-Client-Id"] = []string{v}
		r.Header["X-Forwarded-For"] = []string{v, v}
		r.Header["Forwarded"] = []string{v}
		key, err := hdr(r)
		trimmed := textproto.TrimString(v)
		switch {
		case trimmed == "":
			if err == nil {
				t.Fatalf("blank header %q gave key %q", v, key)
			}
		case err != nil:
			t.Fatalf("header %q: %v", v, err)
		case len(trimmed) <= MaxVerbatimKeyLen && printable(trimmed) && !strings.HasPrefix(trimmed, HashPrefix):
			if SafeKey(key) != trimmed {
				t.Fatalf("header %q gave key %q, want it unchanged", v, SafeKey(key))
			}
		}
		if safe := SafeKey(key); err == nil && (len(safe) > MaxVerbatimKeyLen || !printable(safe)) {
			t.Fatalf("unsafe key %q", safe)
		}
		for _, ip := range ips {
			key, err := ip(r)
			if err != nil {
				continue
			}
			if _, perr := netip.ParsePrefix(key); perr != nil {
				if _, aerr := netip.ParseAddr(key); aerr != nil || len(key) > MaxVerbatimKeyLen {
					t.Fatalf("fields %q gave key %q, neither an address nor a prefix", v, key)
				}
			}
		}
	})
}
