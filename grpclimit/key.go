package grpclimit

import (
	"context"
	"errors"
	"net/http"
	"net/textproto"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/holdfast/holdfast/httplimit"
)

// A KeyFunc returns the client key of a call to fullMethod: whose quota
// it spends. ctx is the call's (a stream's) context, with its incoming
// metadata and peer. A call that carries no usable key is refused with a
// *httplimit.ClientError (the call ends with InvalidArgument and its
// Reason) or with a gRPC status error, whose code and message end the
// call as they are (status.Error(codes.Unauthenticated, …) for a missing
// credential); any other error is the server's own (Internal). The
// interceptor passes every key through httplimit.SafeKey, so a KeyFunc may
// return what the client sent.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// Metadata returns a KeyFunc that keys a call by the first value of its
// incoming metadata name (case-insensitive, as gRPC metadata keys are),
// trimmed of spaces and tabs. A missing or blank value is a
// *httplimit.ClientError "missing metadata NAME", so the call ends with
// InvalidArgument: a service whose key is a credential checks it before
// the limiter, or returns codes.Unauthenticated from its own KeyFunc.
func Metadata(name string) KeyFunc {
	name = strings.ToLower(name)
	missing := "missing metadata " + name
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if vs := md[name]; len(vs) > 0 {
			if v := textproto.TrimString(vs[0]); v != "" {
				return v, nil
			}
		}
		return "", &httplimit.ClientError{Reason: missing}
	}
}

// Peer returns a KeyFunc that keys a call by its client's IP address
// exactly as httplimit.ClientIP(o) keys an HTTP request: "192.0.2.1" for
// an IPv4 client, "2001:db8:1:2::/64" for an IPv6 client with the default
// prefix. The zero IPOptions keys by the peer address of the connection.
// With o.TrustedProxies, behind proxies that append to the
// x-forwarded-for metadata (or forwarded, with o.Forwarded), as Envoy
// does, the client is the address those proxies wrote; see
// httplimit.IPOptions. A peer without an IP address (a Unix socket) is
// the server's error, Internal: key such calls by Metadata. Peer panics
// on options ClientIP refuses.
func Peer(o httplimit.IPOptions) KeyFunc {
	clientIP := httplimit.ClientIP(o)
	field, header := "x-forwarded-for", "X-Forwarded-For"
	if o.Forwarded {
		field, header = "forwarded", "Forwarded"
	}
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", errors.New("grpclimit: the call has no peer")
		}
		// ClientIP reads only these two parts of a request.
		r := &http.Request{RemoteAddr: p.Addr.String()}
		if o.TrustedProxies > 0 {
			md, _ := metadata.FromIncomingContext(ctx)
			r.Header = http.Header{header: md[field]}
		}
		return clientIP(r)
	}
}
