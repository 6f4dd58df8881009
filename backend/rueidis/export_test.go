package rueidis

// SetPipelineSizing sets RunMany's chunk size and the number of chunks in
// flight, and returns a func that restores the previous values. It is for
// benchmarks, which run alone: no RunMany may run meanwhile.
func SetPipelineSizing(chunk, workers int) (restore func()) {
	oldChunk, oldWorkers := pipelineChunk, pipelineWorkers
	pipelineChunk, pipelineWorkers = chunk, workers
	return func() { pipelineChunk, pipelineWorkers = oldChunk, oldWorkers }
}
