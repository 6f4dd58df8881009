//go:build !race

package fallback_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
