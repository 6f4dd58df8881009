package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
)

// MaxVerbatimKeyLen is the longest client key passed on unchanged, in bytes. See
// SafeKey.
const MaxVerbatimKeyLen = 128

// HashPrefix starts every key that SafeKey replaced by its hash.
const HashPrefix = "sha256:"

// KeySource says where a request's client key comes from: a request header
// ("header:X-Client-ID") or the client's IP address ("ip"). The zero
// KeySource is invalid; build one with ParseKeySource.
type KeySource struct {
	name   string // the header name as configured, for messages
	header string // its canonical form; "" for an ip source
	ip     bool
	// TrustProxy makes an ip source take the client address from the
	// request's X-Forwarded-For (its last address: the one the proxy in
	// front of this service saw) or, without it, X-Real-IP, instead of the
	// connection's peer. Set it only behind a proxy that sets or appends
	// X-Forwarded-For: otherwise every client can choose its own key. The
	// config field is the top-level trust_proxy.
	TrustProxy bool
}

// ParseKeySource parses "header:NAME", where NAME is a header field name
// (an RFC 9110 token), or "ip".
func ParseKeySource(s string) (KeySource, error) {
	if s == "ip" {
		return KeySource{ip: true}, nil
	}
	name, ok := strings.CutPrefix(s, "header:")
	if !ok {
		return KeySource{}, fmt.Errorf("config: key source %s: want header:NAME or ip", show(s))
	}
	if !isToken(name) {
		return KeySource{}, fmt.Errorf("config: key source %s: header name must be a non-empty token (letters, digits, !#$%%&'*+-.^_`|~)", show(s))
	}
	return KeySource{name: name, header: http.CanonicalHeaderKey(name)}, nil
}

// String returns the source as ParseKeySource reads it.
func (k KeySource) String() string {
	switch {
	case k.header != "":
		return "header:" + k.name
	case k.ip:
		return "ip"
	}
	return "invalid-key-source"
}

// Header returns the canonical name of a header source's header, or "".
func (k KeySource) Header() string { return k.header }

func (k KeySource) valid() bool { return k.header != "" || k.ip }

// A KeyError reports a request that carries no usable client key: a client
// error (HTTP 400). Reason is safe to show to the client.
type KeyError struct {
	Reason string
}

// Error returns "config: " + Reason.
func (e *KeyError) Error() string { return "config: " + e.Reason }

// Extract returns r's client key, made safe by SafeKey. A missing or empty
// header, or a proxy header that holds no IP address, is a *KeyError; any
// other error is the server's fault (a zero KeySource, a peer address that
// is not an IP address).
func (k KeySource) Extract(r *http.Request) (string, error) {
	switch {
	case k.header != "":
		v := textproto.TrimString(r.Header.Get(k.header))
		if v == "" {
			return "", &KeyError{Reason: "missing header " + k.name}
		}
		return SafeKey(v), nil
	case k.ip:
		addr, err := k.clientAddr(r)
		if err != nil {
			return "", err
		}
		return SafeKey(addr.String()), nil
	}
	return "", errors.New("config: zero KeySource: build it with ParseKeySource")
}

// clientAddr returns the client's IP address.
func (k KeySource) clientAddr(r *http.Request) (netip.Addr, error) {
	if k.TrustProxy {
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			last := xff[len(xff)-1]
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			if a, ok := parseAddr(last); ok {
				return a, nil
			}
			return netip.Addr{}, &KeyError{Reason: "X-Forwarded-For does not end with an IP address"}
		}
		if v := r.Header.Get("X-Real-Ip"); v != "" {
			if a, ok := parseAddr(v); ok {
				return a, nil
			}
			return netip.Addr{}, &KeyError{Reason: "X-Real-IP is not an IP address"}
		}
	}
	if a, ok := parseAddr(r.RemoteAddr); ok {
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("config: peer address %s is not an IP address", show(r.RemoteAddr))
}

// parseAddr parses an IP address, with or without a port, dropping an IPv6
// zone and unmapping IPv4-mapped IPv6 addresses, so one client has one key.
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

// SafeKey returns key itself when it is at most MaxVerbatimKeyLen bytes of printable
// ASCII (0x20-0x7E) and does not start with HashPrefix; otherwise HashPrefix
// followed by the hex SHA-256 of key (71 bytes). A client chooses its key,
// so this bounds what one key costs in memory, in Redis and in logs, and
// keeps control bytes and invalid UTF-8 out of both; a hashed key still
// identifies its client. Keys that start with HashPrefix are hashed too, so
// no client can name another's hashed key.
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
