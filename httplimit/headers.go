package httplimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// The header fields follow draft-ietf-httpapi-ratelimit-headers-11 (23 May
// 2026), where both fields are Structured Field Lists (RFC 9651) of Items
// whose value is the policy name as an sf-string:
//
//	RateLimit-Policy: "tb";q=20;w=4
//	RateLimit: "tb";r=5;t=3
//
// RateLimit-Policy (draft section 3): q is the quota, Result.Limit (in
// degraded mode this instance's share); w is the time window in whole
// seconds: a sliding window's length, or for a token bucket the time to
// refill the whole capacity (q per w is then the refill rate; the same time
// for a degraded share, whose capacity and rate are both divided by the
// instance count). w is rounded up and at least 1, as the draft wants a
// non-zero integer.
//
// RateLimit (draft section 4): r is the available quota, Result.Remaining;
// t is the "effective window", the seconds within which the client can use
// no more than r. On an admitted request t is ResetAfter rounded up: the
// time until the full quota is back if nothing more is spent. That is a
// conservative hint (a token bucket refills, a sliding window slides, so a
// client may get more than r within t, never less). On a denied request t
// equals Retry-After, because the draft (section 6) says Retry-After SHOULD
// NOT point earlier than the end of the effective window, and ResetAfter is
// usually later than RetryAfter.
//
// The fields are added, not set, so nested middleware reports one list
// member per policy, as the draft allows.
//
// WithXRateLimit adds X-RateLimit-Limit (q), X-RateLimit-Remaining (r) and
// X-RateLimit-Reset (t, in seconds from now) for clients that know only
// those; WithXRateLimitUnix gives X-RateLimit-Reset as a Unix time instead,
// the first whole second at or after now plus ResetAfter (admitted) or
// RetryAfter, at least one second (denied). These are set, not added: the
// innermost middleware's decision wins.

// xStyle selects the X-RateLimit fields.
type xStyle int

const (
	xNone  xStyle = iota // IETF fields only
	xDelta               // X-RateLimit-Reset in seconds from now
	xUnix                // X-RateLimit-Reset as a Unix time
)

// WithXRateLimit adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset beside the IETF fields, with the same values as their
// q, r and t: the reset is in seconds from now, as Envoy sends it.
func WithXRateLimit() Option {
	return func(o *options) { o.xstyle = xDelta }
}

// WithXRateLimitUnix is WithXRateLimit with X-RateLimit-Reset as a Unix
// time in seconds, as GitHub's API, ulule/limiter and go-chi/httprate send
// it, from the middleware's clock (WithClock).
func WithXRateLimitUnix() Option {
	return func(o *options) { o.xstyle = xUnix }
}

// Fields returns the values of the RateLimit-Policy and RateLimit fields
// that New sends for decision res under policy p (see above), and the
// Retry-After of a denial in whole seconds ("" when res admits), so that
// other transports send the same values: grpclimit sends them as gRPC
// metadata.
func Fields(p core.Policy, res core.Result) (policy, rateLimit, retry string) {
	name := sfString(p.Name())
	t := ceilSeconds(res.ResetAfter)
	if !res.Allowed {
		t = retryAfter(res)
		retry = itoa(t)
	}
	policy = name + ";q=" + itoa(max(res.Limit, 0)) + ";w=" + itoa(window(p))
	rateLimit = name + ";r=" + itoa(max(res.Remaining, 0)) + ";t=" + itoa(t)
	return policy, rateLimit, retry
}

// setHeaders adds the RateLimit-Policy and RateLimit fields, sets
// Retry-After on a denial, and sets the X-RateLimit fields if chosen, for
// decision res under policy p.
func (m *middleware) setHeaders(h http.Header, p core.Policy, res core.Result) {
	policy, rateLimit, retry := Fields(p, res)
	h.Add("RateLimit-Policy", policy)
	h.Add("RateLimit", rateLimit)
	if retry != "" {
		h.Set("Retry-After", retry)
	}
	if m.o.xstyle == xNone {
		return
	}
	t, reset := ceilSeconds(res.ResetAfter), res.ResetAfter
	if !res.Allowed {
		t, reset = retryAfter(res), max(res.RetryAfter, time.Second)
	}
	h.Set("X-RateLimit-Limit", itoa(max(res.Limit, 0)))
	h.Set("X-RateLimit-Remaining", itoa(max(res.Remaining, 0)))
	if m.o.xstyle == xUnix {
		at := m.o.now().Add(reset)
		t = at.Unix()
		if at.Nanosecond() != 0 {
			t++
		}
	}
	h.Set("X-RateLimit-Reset", itoa(t))
}

// window returns the w parameter of policy p (see above): its
// algorithm's quota window (driver.Quotaer), else its interval.
func window(p core.Policy) int64 {
	w := p.Interval()
	if q, ok := p.Algorithm().(driver.Quotaer); ok {
		_, w = q.Quota(p)
	}
	return max(ceilSeconds(w), 1)
}

// retryAfter is the Retry-After of a denial, in whole seconds: RetryAfter
// rounded up, at least 1.
func retryAfter(res core.Result) int64 {
	return max(ceilSeconds(res.RetryAfter), 1)
}

// ceilSeconds rounds d up to whole seconds; negative durations are 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// sfString serialises s as a Structured Field String (RFC 9651 section
// 4.1.6). Policy names are letters, digits, '_', '-' and '.', so this only
// quotes them; other bytes are escaped or dropped to keep the field valid.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c <= 0x7e:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
