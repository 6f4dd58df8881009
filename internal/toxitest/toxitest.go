// Package toxitest puts an in-process toxiproxy (github.com/Shopify/toxiproxy/v2,
// used as a library: no toxiproxy binary, no HTTP API) between a test's
// clients and one TCP upstream, and injects network faults on that link: a
// black hole, a refused port, latency, a trickle, resets.
//
// Each Proxy listens on its own free 127.0.0.1 port and is stopped when the
// test ends, so tests using it may run in parallel. Methods report failures
// with t.Errorf (never t.Fatal), so they may be called from a goroutine the
// test waits for.
package toxitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Stream is a direction of the link.
type Stream string

const (
	// Upstream is the data the client sends to the server (requests).
	Upstream Stream = "upstream"
	// Downstream is the data the server sends back (replies).
	Downstream Stream = "downstream"
)

var quietOnce sync.Once

// quiet keeps toxiproxy's global zerolog logger (the bandwidth toxic logs
// every removal at trace level on stderr) to warnings and worse. zerolog is
// toxiproxy's alone in holdfast, so the global level touches nothing else.
func quiet() { zerolog.SetGlobalLevel(zerolog.WarnLevel) }

// Proxy is one proxied link: clients connect to Addr, the proxy connects
// each to the upstream. It is safe for concurrent use.
type Proxy struct {
	t        testing.TB
	upstream string
	p        *toxiproxy.Proxy

	mu  sync.Mutex // guards seq
	seq int

	cutMu sync.Mutex // guards cut; held while the cut is made or healed
	cut   *Toxic     // the black hole of Cut, nil when not cut
}

// Start starts a proxy on a free 127.0.0.1 port in front of upstream
// ("host:port") and stops it, with its toxics and connections, when the
// test ends.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	quietOnce.Do(quiet)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "toxitest "+upstream, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxitest: start proxy to %s: %v", upstream, err)
	}
	px := &Proxy{t: t, upstream: upstream, p: p}
	t.Cleanup(px.close)
	return px
}

// Addr is the proxy's "127.0.0.1:port", where clients connect. It stays the
// same across Disable and Enable.
func (px *Proxy) Addr() string {
	px.p.Lock()
	defer px.p.Unlock()
	return px.p.Listen
}

// Upstream is the address the proxy forwards to.
func (px *Proxy) Upstream() string { return px.upstream }

// Disable stops the proxy: its open connections are closed and new ones are
// refused (a host that is down or a port that is closed). Enable undoes it.
func (px *Proxy) Disable() { px.p.Stop() }

// Enable starts a disabled proxy again on the same port.
func (px *Proxy) Enable() {
	if err := px.p.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		px.t.Errorf("toxitest: enable proxy %s: %v", px.Addr(), err)
	}
}

// Cut black-holes the link, as a network partition does: connections stay
// open and new ones are accepted, but nothing passes in either direction,
// so a caller waits for its own deadline. Restore undoes it. Cutting a cut
// link does nothing.
func (px *Proxy) Cut() {
	px.cutMu.Lock()
	defer px.cutMu.Unlock()
	if px.cut == nil {
		px.cut = px.AddTimeout(0, Upstream, Downstream)
	}
}

// Restore heals a cut link. The connections that were open during the cut
// are closed (as a peer that timed them out would), so clients reconnect.
func (px *Proxy) Restore() {
	px.cutMu.Lock()
	defer px.cutMu.Unlock()
	if px.cut != nil {
		px.cut.Remove()
		px.cut = nil
	}
}

// Toxic is one fault added to a proxy, on one or more streams.
type Toxic struct {
	px    *Proxy
	names []string
}

// Remove takes the fault off the link. Data a toxic holds is passed on
// (latency, bandwidth, slicer); a timeout or reset toxic closes the
// connections it holds.
func (tx *Toxic) Remove() {
	if tx == nil {
		return
	}
	for _, n := range tx.names {
		if err := tx.px.p.Toxics.RemoveToxic(context.Background(), n); err != nil {
			tx.px.t.Errorf("toxitest: remove toxic %s: %v", n, err)
		}
	}
}

// AddLatency delays every chunk of data by latency ± jitter, on each of
// streams (Downstream when none is given): on one stream it adds latency to
// a round trip, on both twice that.
func (px *Proxy) AddLatency(latency, jitter time.Duration, streams ...Stream) *Toxic {
	return px.add("latency", map[string]int64{"latency": latency.Milliseconds(), "jitter": jitter.Milliseconds()}, streams)
}

// AddBandwidth limits each connection to kbps KB/s on each of streams
// (Downstream when none is given).
func (px *Proxy) AddBandwidth(kbps int64, streams ...Stream) *Toxic {
	return px.add("bandwidth", map[string]int64{"rate": kbps}, streams)
}

// AddSlicer cuts data into chunks of about avg ± variation bytes, sent
// delay apart, on each of streams (Downstream when none is given).
func (px *Proxy) AddSlicer(avg, variation int, delay time.Duration, streams ...Stream) *Toxic {
	return px.add("slicer", map[string]int64{"average_size": int64(avg), "size_variation": int64(variation), "delay": delay.Microseconds()}, streams)
}

// AddTimeout drops all data on each of streams (Downstream when none is
// given) and, when after > 0, closes the connection after that long.
func (px *Proxy) AddTimeout(after time.Duration, streams ...Stream) *Toxic {
	return px.add("timeout", map[string]int64{"timeout": after.Milliseconds()}, streams)
}

// ResetPeer resets each connection (TCP RST) after that long once data
// arrives on one of streams (Downstream when none is given), dropping that
// data. On Upstream the request never reaches the server; on Downstream the
// server has handled it and the reply is lost.
func (px *Proxy) ResetPeer(after time.Duration, streams ...Stream) *Toxic {
	return px.add("reset_peer", map[string]int64{"timeout": after.Milliseconds()}, streams)
}

// Reset removes every toxic, the Cut included.
func (px *Proxy) Reset() {
	px.cutMu.Lock()
	defer px.cutMu.Unlock()
	px.cut = nil
	px.p.Toxics.ResetToxics(context.Background())
}

func (px *Proxy) add(typ string, attrs map[string]int64, streams []Stream) *Toxic {
	if len(streams) == 0 {
		streams = []Stream{Downstream}
	}
	tx := &Toxic{px: px}
	for _, s := range streams {
		px.mu.Lock()
		px.seq++
		name := fmt.Sprintf("%s_%s_%d", typ, s, px.seq)
		px.mu.Unlock()
		body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": s, "toxicity": 1.0, "attributes": attrs})
		if err == nil {
			_, err = px.p.Toxics.AddToxicJson(bytes.NewReader(body))
		}
		if err != nil {
			px.t.Errorf("toxitest: add %s toxic on %s: %v", typ, s, err)
			continue
		}
		tx.names = append(tx.names, name)
	}
	return tx
}

// close is the test cleanup: the toxics first, so none holds data for a
// connection that is going away, then the listener and the connections.
func (px *Proxy) close() {
	px.Reset()
	px.p.Stop()
}
