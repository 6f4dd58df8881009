package httplimit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
)

// A KeyFunc returns the client key of a request: whose quota it spends. A
// request that carries no usable key is refused with a *ClientError (the
// default error handler answers 400); any other error is the server's own
// (500). The middleware passes every key through SafeKey, so a KeyFunc may
// return what the client sent.
type KeyFunc func(r *http.Request) (string, error)

// A ClientError reports a request that cannot be limited through its own
// fault: it has no client key, or it costs more than the policy's limit and
// could never be admitted. Reason is safe to show to the client; the
// default error handler answers 400 Bad Request with it. Key and cost
// functions return a ClientError to refuse a request.
type ClientError struct {
	Reason string
}

// Error returns "httplimit: " + Reason.
func (e *ClientError) Error() string { return "httplimit: " + e.Reason }

// Header returns a KeyFunc that keys a request by the first value of its
// header name, trimmed of spaces and tabs. A missing or blank header is a
// *ClientError "missing header NAME".
func Header(name string) KeyFunc {
	canonical := http.CanonicalHeaderKey(name)
	missing := "missing header " + name
	return func(r *http.Request) (string, error) {
		v := textproto.TrimString(r.Header.Get(canonical))
		if v == "" {
			return "", &ClientError{Reason: missing}
		}
		return v, nil
	}
}

// Cookie returns a KeyFunc that keys a request by the value of its cookie
// name. A missing or empty cookie is a *ClientError "missing cookie NAME".
func Cookie(name string) KeyFunc {
	missing := "missing cookie " + name
	return func(r *http.Request) (string, error) {
		c, err := r.Cookie(name)
		if err != nil || c.Value == "" {
			return "", &ClientError{Reason: missing}
		}
		return c.Value, nil
	}
}

// Query returns a KeyFunc that keys a request by the first value of its
// URL query parameter name. A missing or empty parameter is a *ClientError
// "missing query parameter NAME".
func Query(name string) KeyFunc {
	missing := "missing query parameter " + name
	return func(r *http.Request) (string, error) {
		v := r.URL.Query().Get(name)
		if v == "" {
			return "", &ClientError{Reason: missing}
		}
		return v, nil
	}
}

// IPOptions says how ClientIP finds a request's client address and how it
// groups addresses into keys. The zero IPOptions keys by the connection's
// peer address, one key per IPv4 address and per IPv6 /64.
type IPOptions struct {
	// TrustedProxies is the number of reverse proxies in front of the
	// service, each appending the address it received the request from to
	// X-Forwarded-For (or Forwarded). The client is then the
	// TrustedProxies-th address from the end of the list: addresses
	// further left were written by the client and are ignored, so a client
	// cannot choose its own key. A list shorter than that (a request that
	// passed fewer proxies) gives its first address; a request without the
	// field gives the peer address. 0 (the default) ignores the fields and
	// keys by the peer address: right for a service that clients reach
	// directly, since any client can write the fields.
	TrustedProxies int
	// Forwarded makes ClientIP read the for= parameters of the RFC 7239
	// Forwarded field instead of X-Forwarded-For.
	Forwarded bool
	// IPv6Prefix is the prefix length that groups IPv6 clients into one
	// key: 0 means 64, the subnet of one end site, in which one client can
	// choose among 2^64 addresses. 128 keys each address.
	IPv6Prefix int
	// IPv4Prefix is the prefix length that groups IPv4 clients: 0 means 32,
	// one key per address.
	IPv4Prefix int
}

// ClientIP returns a KeyFunc that keys a request by its client's IP
// address as o says: "192.0.2.1" for an IPv4 client, "2001:db8:1:2::/64"
// for an IPv6 client with the default prefix (an address alone when the
// prefix is its full length). IPv4-mapped IPv6 addresses count as IPv4 and
// zones are dropped. A forwarded address that is not an IP address (such
// as "unknown") is a *ClientError. ClientIP panics if o holds a negative
// count or a prefix length out of range, like regexp.MustCompile.
func ClientIP(o IPOptions) KeyFunc {
	if o.IPv6Prefix == 0 {
		o.IPv6Prefix = 64
	}
	if o.IPv4Prefix == 0 {
		o.IPv4Prefix = 32
	}
	if o.TrustedProxies < 0 || o.IPv6Prefix < 0 || o.IPv6Prefix > 128 || o.IPv4Prefix < 0 || o.IPv4Prefix > 32 {
		panic(fmt.Sprintf("httplimit: ClientIP: bad IPOptions %+v", o))
	}
	return func(r *http.Request) (string, error) {
		a, err := o.clientAddr(r)
		if err != nil {
			return "", err
		}
		bits := o.IPv6Prefix
		if a.Is4() {
			bits = o.IPv4Prefix
		}
		if bits == a.BitLen() {
			return a.String(), nil
		}
		p, _ := a.Prefix(bits) // bits is in range for a
		return p.String(), nil
	}
}

// clientAddr returns the client's address: see IPOptions.TrustedProxies.
func (o IPOptions) clientAddr(r *http.Request) (netip.Addr, error) {
	if o.TrustedProxies > 0 {
		field := "X-Forwarded-For"
		if o.Forwarded {
			field = "Forwarded"
		}
		lines := r.Header.Values(field)
		if _, n := listElement(lines, -1, o.Forwarded); n > 0 {
			e, _ := listElement(lines, max(n-o.TrustedProxies, 0), o.Forwarded)
			if o.Forwarded {
				e = forwardedFor(e)
			}
			if a, ok := parseAddr(e); ok {
				return a, nil
			}
			return netip.Addr{}, &ClientError{Reason: field + " names no IP address for the client"}
		}
	}
	if a, ok := parseAddr(r.RemoteAddr); ok {
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("httplimit: peer address %q is not an IP address", r.RemoteAddr)
}

// listElement returns element i (from 0) of a comma-separated header field
// given as its lines, and the number of elements. Elements are trimmed and
// empty ones do not count; with quotes, commas inside quoted strings
// (Forwarded's) do not separate. i < 0 only counts. It allocates nothing,
// however long a client makes the field.
func listElement(lines []string, i int, quotes bool) (elem string, n int) {
	for _, line := range lines {
		for line != "" {
			var e string
			e, line = cut(line, ',', quotes)
			if e = textproto.TrimString(e); e != "" {
				if n == i {
					return e, n + 1
				}
				n++
			}
		}
	}
	return "", n
}

// forwardedFor returns the for= value of a Forwarded element such as
// `for="[2001:db8::1]:4711";proto=https`, unquoted, or "" without one.
func forwardedFor(elem string) string {
	for elem != "" {
		var pair string
		pair, elem = cut(elem, ';', true)
		name, value, _ := strings.Cut(textproto.TrimString(pair), "=")
		if !strings.EqualFold(textproto.TrimString(name), "for") {
			continue
		}
		value = textproto.TrimString(value)
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			var b strings.Builder
			for k := 1; k < len(value)-1; k++ {
				if value[k] == '\\' && k+1 < len(value)-1 {
					k++
				}
				b.WriteByte(value[k])
			}
			value = b.String()
		}
		return value
	}
	return ""
}

// cut is strings.Cut on the first sep; with quotes, on the first outside a
// quoted string (RFC 9110 section 5.6.4).
func cut(s string, sep byte, quotes bool) (before, after string) {
	quoted := false
	for j := 0; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"' && quotes:
			quoted = !quoted
		case c == '\\' && quoted:
			j++
		case c == sep && !quoted:
			return s[:j], s[j+1:]
		}
	}
	return s, ""
}

// parseAddr parses an IP address, with or without a port or brackets,
// dropping an IPv6 zone and unmapping IPv4-mapped IPv6 addresses, so one
// client has one key.
func parseAddr(s string) (netip.Addr, bool) {
	s = textproto.TrimString(s)
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// MaxVerbatimKeyLen is the longest client key SafeKey passes on unchanged,
// in bytes.
const MaxVerbatimKeyLen = 128

// HashPrefix starts every key that SafeKey replaced by its hash.
const HashPrefix = "sha256:"

// SafeKey returns key itself when it is at most MaxVerbatimKeyLen bytes of
// printable ASCII (0x20-0x7E) and does not start with HashPrefix; otherwise
// HashPrefix followed by the hex SHA-256 of key (71 bytes). A client
// chooses its key, so this bounds what one key costs in memory, in Redis
// and in logs, and keeps control bytes and invalid UTF-8 out of both; a
// hashed key still identifies its client. Keys that start with HashPrefix
// are hashed too, so no client can name another's hashed key. The
// middleware applies it to every key a KeyFunc returns.
func SafeKey(key string) string {
	if len(key) <= MaxVerbatimKeyLen && !strings.HasPrefix(key, HashPrefix) && printable(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return HashPrefix + hex.EncodeToString(sum[:])
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
