//go:build race

package fallback_test

// raceEnabled: the race detector multiplies memory use, so RSS bounds are
// checked only without it (make chaos runs the flood test that way).
const raceEnabled = true
