package goredis

import "github.com/holdfast/holdfast/internal/pipeline"

// SetPipelineSizing sets RunMany's chunk size and the number of chunks in
// flight, and returns a func that restores the previous values. It is for
// benchmarks, which run alone: no RunMany may run meanwhile.
func SetPipelineSizing(chunk, workers int) (restore func()) {
	old := sizing
	sizing = pipeline.Sizing{Chunk: chunk, Workers: workers}
	return func() { sizing = old }
}

// CoalesceStats returns the pipelines of coalesced Run calls s has sent and
// the calls in them; zeros when s does not coalesce.
func (s *Store) CoalesceStats() (pipelines, calls int64) {
	if s.co == nil {
		return 0, 0
	}
	return s.co.batches.Load(), s.co.calls.Load()
}

// CoalesceSettings reports whether s coalesces and, if so, with how many
// pipelines at most and how many calls in each.
func (s *Store) CoalesceSettings() (on bool, pipelines, maxBatch int) {
	if s.co == nil {
		return false, 0, 0
	}
	return true, s.co.pipelines, s.co.maxBatch
}

// Flushers returns the number of flusher goroutines s runs now.
func (s *Store) Flushers() int {
	if s.co == nil {
		return 0
	}
	s.co.mu.Lock()
	defer s.co.mu.Unlock()
	return s.co.flushers
}

// CollapseStats returns the calls of several decisions on one key s has
// sent and the decisions in them; zeros when s does not collapse.
func (s *Store) CollapseStats() (calls, decisions int64) {
	if s.dec == nil {
		return 0, 0
	}
	return s.dec.Batched()
}

// KeysStats returns the calls of several keys s has sent and the
// decisions in them; zeros when s does not collapse.
func (s *Store) KeysStats() (calls, decisions int64) {
	if s.dec == nil {
		return 0, 0
	}
	return s.dec.Keyed()
}
