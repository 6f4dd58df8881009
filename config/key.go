package config

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/holdfast/holdfast/httplimit"
)

// KeySource says where a request's client key comes from: a request header
// ("header:X-Client-ID"), a cookie ("cookie:session"), a URL query
// parameter ("query:api_key") or the client's IP address ("ip"). The zero
// KeySource names no source: the code that routes the policy supplies its
// own httplimit.KeyFunc. Build one with ParseKeySource.
type KeySource struct {
	kind keyKind
	name string // the header, cookie or parameter name as configured
	// IP is how an ip source finds and groups the client's address: the
	// config's top-level client_ip block. Other sources ignore it.
	IP httplimit.IPOptions
}

type keyKind uint8

const (
	noKey keyKind = iota
	headerKey
	cookieKey
	queryKey
	ipKey
)

// keyPrefixes are the NAME-taking sources' prefixes, by kind.
var keyPrefixes = [...]string{headerKey: "header:", cookieKey: "cookie:", queryKey: "query:"}

// ParseKeySource parses "header:NAME" or "cookie:NAME", where NAME is an
// RFC 9110 token, "query:NAME", where NAME is printable ASCII without
// spaces or any of "#&=%", or "ip".
func ParseKeySource(s string) (KeySource, error) {
	if s == "ip" {
		return KeySource{kind: ipKey}, nil
	}
	for kind := headerKey; kind <= queryKey; kind++ {
		name, ok := strings.CutPrefix(s, keyPrefixes[kind])
		if !ok {
			continue
		}
		switch {
		case kind == queryKey && (name == "" || !printable(name) || strings.ContainsAny(name, " #&=%")):
			return KeySource{}, fmt.Errorf("config: key source %s: query parameter name must be non-empty printable ASCII without spaces or #&=%%", show(s))
		case kind != queryKey && !isToken(name):
			return KeySource{}, fmt.Errorf("config: key source %s: %sname must be a non-empty token (letters, digits, !#$%%&'*+-.^_`|~)", show(s), strings.TrimSuffix(keyPrefixes[kind], ":")+" ")
		}
		return KeySource{kind: kind, name: name}, nil
	}
	return KeySource{}, fmt.Errorf("config: key source %s: want header:NAME, cookie:NAME, query:NAME or ip", show(s))
}

// String returns the source as ParseKeySource reads it, or "" for the zero
// KeySource.
func (k KeySource) String() string {
	switch k.kind {
	case ipKey:
		return "ip"
	case noKey:
		return ""
	}
	return keyPrefixes[k.kind] + k.name
}

// IsZero reports whether k names no source.
func (k KeySource) IsZero() bool { return k.kind == noKey }

// Header returns the canonical name of a header source's header, or "".
func (k KeySource) Header() string {
	if k.kind != headerKey {
		return ""
	}
	return http.CanonicalHeaderKey(k.name)
}

// KeyFunc returns the key function of k: httplimit.Header, Cookie, Query
// or ClientIP(k.IP); nil for the zero KeySource. It panics if k.IP is out
// of range, which Validate reports.
func (k KeySource) KeyFunc() httplimit.KeyFunc {
	switch k.kind {
	case headerKey:
		return httplimit.Header(k.name)
	case cookieKey:
		return httplimit.Cookie(k.name)
	case queryKey:
		return httplimit.Query(k.name)
	case ipKey:
		return httplimit.ClientIP(k.IP)
	}
	return nil
}

// checkIP returns what is wrong with ip options, or "".
func checkIP(o httplimit.IPOptions) string {
	switch {
	case o.TrustedProxies < 0:
		return fmt.Sprintf("trusted_proxies: want 0 or more, got %d", o.TrustedProxies)
	case o.IPv6Prefix < 0 || o.IPv6Prefix > 128:
		return fmt.Sprintf("ipv6_prefix: want 1 to 128, got %d", o.IPv6Prefix)
	case o.IPv4Prefix < 0 || o.IPv4Prefix > 32:
		return fmt.Sprintf("ipv4_prefix: want 1 to 32, got %d", o.IPv4Prefix)
	}
	return ""
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// isToken reports whether s is an RFC 9110 token, the syntax of a header
// field name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}
