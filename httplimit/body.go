package httplimit

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
)

// internalError is the whole body of a 500: nothing about the cause.
const internalError = "internal error"

// Body is the JSON body of a decision: the 429 that New writes by default,
// and the 200 that AllowedJSON writes.
type Body struct {
	// Allowed reports whether the request was admitted.
	Allowed bool `json:"allowed"`
	// Remaining is what the client may still spend now.
	Remaining int64 `json:"remaining"`
	// Mode is the path that decided: "redis", "local", "fail_open" or
	// "fail_closed" (core.Mode).
	Mode string `json:"mode"`
	// RetryAfterMS is how long a denied client should wait, in
	// milliseconds rounded up; absent when allowed.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
	// Policy is the policy's name.
	Policy string `json:"policy"`
}

type errorBody struct {
	Error string `json:"error"`
}

// AllowedJSON is a handler that answers 200 with the Body of the decision
// that admitted the request, e.g.
// {"allowed":true,"remaining":4,"mode":"redis","policy":"tb"}. Use it
// behind New; without a decision in the request's context it answers 500.
func AllowedJSON(w http.ResponseWriter, r *http.Request) {
	d, ok := r.Context().Value(ctxKey{}).(decision)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: internalError})
		return
	}
	writeJSON(w, http.StatusOK, Body{Allowed: true, Remaining: max(d.res.Remaining, 0), Mode: d.res.Mode.String(), Policy: d.policy})
}

// deny is the default deny handler: 429 with a Body.
func deny(w http.ResponseWriter, r *http.Request, res core.Result) {
	d, _ := r.Context().Value(ctxKey{}).(decision)
	ms := int64(res.RetryAfter / time.Millisecond)
	if res.RetryAfter%time.Millisecond != 0 || ms == 0 {
		ms++
	}
	writeJSON(w, http.StatusTooManyRequests, Body{
		Remaining:    max(res.Remaining, 0),
		Mode:         res.Mode.String(),
		RetryAfterMS: ms,
		Policy:       d.policy,
	})
}

// writeError is the default error handler: see WithErrorHandler.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	if ce, ok := errors.AsType[*ClientError](err); ok {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: ce.Reason})
		return
	}
	if r.Context().Err() != nil {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: "request cancelled"})
		return
	}
	writeJSON(w, http.StatusInternalServerError, errorBody{Error: internalError})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // cannot happen: the bodies are plain structs
		status, body = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
