package grpclimit_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/holdfast/holdfast/grpclimit"
	"github.com/holdfast/holdfast/httplimit"
)

// TestPeer: Peer keys as httplimit.ClientIP does: IPv4 by address, IPv6
// by /64, mapped addresses as IPv4; behind trusted proxies from the
// x-forwarded-for (or forwarded) metadata, ignoring what the client wrote
// further left. (The loopback server test in TestKeys covers a real peer.)
func TestPeer(t *testing.T) {
	v4 := &net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 41000}
	v6 := &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::77"), Port: 41000}
	mapped := &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.9"), Port: 41000}
	proxy := &net.TCPAddr{IP: net.ParseIP("10.0.0.2"), Port: 41000}
	unix := &net.UnixAddr{Name: "/run/app.sock", Net: "unix"}
	tests := []struct {
		name string
		o    httplimit.IPOptions
		addr net.Addr
		md   metadata.MD
		want string // the key, or the error
	}{
		{"IPv4", httplimit.IPOptions{}, v4, nil, "192.0.2.1"},
		{"IPv6 by /64", httplimit.IPOptions{}, v6, nil, "2001:db8:1:2::/64"},
		{"IPv6 by /128", httplimit.IPOptions{IPv6Prefix: 128}, v6, nil, "2001:db8:1:2::77"},
		{"IPv4-mapped", httplimit.IPOptions{}, mapped, nil, "192.0.2.9"},
		{"forwarded for ignored without trust", httplimit.IPOptions{}, proxy, metadata.Pairs("x-forwarded-for", "203.0.113.7"), "10.0.0.2"},
		{"one trusted proxy", httplimit.IPOptions{TrustedProxies: 1}, proxy, metadata.Pairs("x-forwarded-for", "6.6.6.6, 203.0.113.7"), "203.0.113.7"},
		{"one trusted proxy, IPv6 client", httplimit.IPOptions{TrustedProxies: 1}, proxy, metadata.Pairs("x-forwarded-for", "2001:db8:1:2::77"), "2001:db8:1:2::/64"},
		{"Forwarded", httplimit.IPOptions{TrustedProxies: 1, Forwarded: true}, proxy, metadata.Pairs("forwarded", `for="[2001:db8::1]:4711";proto=https`), "2001:db8::/64"},
		{"trusted proxy, no field", httplimit.IPOptions{TrustedProxies: 1}, proxy, nil, "10.0.0.2"},
		{"forwarded garbage", httplimit.IPOptions{TrustedProxies: 1}, proxy, metadata.Pairs("x-forwarded-for", "unknown"), "httplimit: X-Forwarded-For names no IP address for the client"},
		{"unix socket", httplimit.IPOptions{}, unix, nil, `httplimit: peer address "/run/app.sock" is not an IP address`},
		{"no peer", httplimit.IPOptions{}, nil, nil, "grpclimit: the call has no peer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if tt.addr != nil {
				ctx = peer.NewContext(ctx, &peer.Peer{Addr: tt.addr})
			}
			if tt.md != nil {
				ctx = metadata.NewIncomingContext(ctx, tt.md)
			}
			got, err := grpclimit.Peer(tt.o)(ctx, check)
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestMetadata: the first value of the key, case-insensitively, trimmed.
func TestMetadata(t *testing.T) {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{"x-api-key": {" k1 ", "k2"}})
	for _, name := range []string{"x-api-key", "X-Api-Key"} {
		if got, err := grpclimit.Metadata(name)(ctx, check); got != "k1" || err != nil {
			t.Errorf("%s: got %q, %v; want k1", name, got, err)
		}
	}
	for _, c := range []context.Context{context.Background(), metadata.NewIncomingContext(context.Background(), metadata.MD{"x-api-key": {}})} {
		_, err := grpclimit.Metadata("x-api-key")(c, check)
		if ce, ok := err.(*httplimit.ClientError); !ok || ce.Reason != "missing metadata x-api-key" {
			t.Errorf("got %v, want a ClientError missing metadata x-api-key", err)
		}
	}
}
