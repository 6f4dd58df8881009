package rueidis

import "github.com/holdfast/holdfast/internal/pipeline"

// SetPipelineSizing sets RunMany's chunk size and the number of chunks in
// flight, and returns a func that restores the previous values. It is for
// benchmarks, which run alone: no RunMany may run meanwhile.
func SetPipelineSizing(chunk, workers int) (restore func()) {
	old := sizing
	sizing = pipeline.Sizing{Chunk: chunk, Workers: workers}
	return func() { sizing = old }
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
