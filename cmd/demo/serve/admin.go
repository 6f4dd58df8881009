package serve

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/httplimit"
)

// The operator's API, on its own listener (--admin-listen; off by
// default, and meant for loopback or a private network: it can unblock
// any client):
//
//	POST /admin/reset?policy=NAME&key=KEY   forget KEY's usage of NAME (204)
//	GET  /admin/peek?policy=NAME&key=KEY[&cost=N]
//	                                        what a request would get, spending nothing (200, JSON)
//
// KEY is the client key as the policy's key source reads it (the value of
// its header, cookie or query parameter, or the client address); it is
// made safe as the middleware makes it (httplimit.SafeKey). During a Redis
// outage a reset applies to this instance's share at once and to Redis
// once it returns (fallback.Limiter.Reset).

// PeekBody is the JSON answer of GET /admin/peek.
type PeekBody struct {
	Policy       string `json:"policy"`
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	Mode         string `json:"mode"`
	Degraded     bool   `json:"degraded"`
}

// AdminHandler is the operator's API (see above).
func (a *App) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/reset", func(w http.ResponseWriter, r *http.Request) {
		p, key, ok := a.adminTarget(w, r)
		if !ok {
			return
		}
		if err := a.lim.Reset(r.Context(), p, key); err != nil {
			adminError(w, err)
			return
		}
		a.log.Info("holdfast reset", "policy", p.Name())
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /admin/peek", func(w http.ResponseWriter, r *http.Request) {
		p, key, ok := a.adminTarget(w, r)
		if !ok {
			return
		}
		cost := int64(1)
		if c := r.URL.Query().Get("cost"); c != "" {
			n, err := strconv.ParseInt(c, 10, 64)
			if err != nil || n < 1 {
				http.Error(w, "cost: want a positive integer, got "+strconv.Quote(c), http.StatusBadRequest)
				return
			}
			cost = n
		}
		res, err := a.lim.Peek(r.Context(), p, key, cost)
		if err != nil {
			adminError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(PeekBody{
			Policy: p.Name(), Allowed: res.Allowed, Limit: res.Limit, Remaining: res.Remaining,
			RetryAfterMS: ceilMS(res.RetryAfter), ResetAfterMS: ceilMS(res.ResetAfter),
			Mode: res.Mode.String(), Degraded: res.Degraded,
		})
	})
	return mux
}

// adminTarget reads the policy and key of an admin request, answering 400
// or 404 itself when they are missing or unknown.
func (a *App) adminTarget(w http.ResponseWriter, r *http.Request) (core.Policy, string, bool) {
	q := r.URL.Query()
	name, key := q.Get("policy"), q.Get("key")
	switch {
	case name == "":
		http.Error(w, "policy: required", http.StatusBadRequest)
		return core.Policy{}, "", false
	case key == "":
		http.Error(w, "key: required", http.StatusBadRequest)
		return core.Policy{}, "", false
	}
	p, err := a.cfg.Registry().Lookup(name)
	if err != nil {
		http.Error(w, "policy: unknown policy "+strconv.Quote(name), http.StatusNotFound)
		return core.Policy{}, "", false
	}
	return p, httplimit.SafeKey(key), true
}

// adminError answers a request the limiter refused: 400 for a bad request,
// 503 otherwise (the limiter is closing).
func adminError(w http.ResponseWriter, err error) {
	code := http.StatusServiceUnavailable
	if core.ClassOf(err) == core.ClassRequest && !errors.Is(err, core.ErrWrongType) {
		code = http.StatusBadRequest
	}
	http.Error(w, err.Error(), code)
}

// ceilMS is d in whole milliseconds, rounded up; 0 for d <= 0.
func ceilMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
