package driver

import (
	crand "crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"math/rand/v2"
	"sync"
)

// RequestIDLen is the length of a NewRequestID id.
const RequestIDLen = 22

// idSources are ChaCha8 generators, each seeded from crypto/rand when it is
// made: a goroutine takes one for the 16 bytes of an id, so ids are drawn
// from cryptographically strong streams without a system call each.
var idSources = sync.Pool{New: func() any {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails on supported platforms (Go 1.24+)
	return rand.NewChaCha8(seed)
}}

// NewRequestID returns a new request id: 128 random bits as 22 characters
// of unpadded base64url. Two ids collide with probability about n²/2¹²⁹
// over n ids. It is the default Options.NewID: the sliding window keeps an
// id per request admitted in the window, so an id shorter than a UUID's 36
// characters is Redis memory saved per request, and drawing it from a
// pooled stream saves a getrandom system call per decision.
func NewRequestID() string {
	src := idSources.Get().(*rand.ChaCha8)
	var raw [16]byte
	binary.LittleEndian.PutUint64(raw[:8], src.Uint64())
	binary.LittleEndian.PutUint64(raw[8:], src.Uint64())
	idSources.Put(src)
	var out [RequestIDLen]byte
	base64.RawURLEncoding.Encode(out[:], raw[:])
	return string(out[:])
}
