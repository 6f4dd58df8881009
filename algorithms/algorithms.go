// Package algorithms registers every built-in algorithm with driver.Register,
// for the packages that find algorithms by name (config, the fallback
// layer's state dir): import it for its side effect. Each algorithm lives
// in a sub-package of its own, with its decision script, Go twin, lease
// share and replay (the capabilities of core/driver/seam.go).
package algorithms

import (
	_ "github.com/holdfast/holdfast/algorithms/slidingcounter"
	_ "github.com/holdfast/holdfast/algorithms/slidingwindow"
	_ "github.com/holdfast/holdfast/algorithms/tokenbucket"
)
