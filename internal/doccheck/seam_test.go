package doccheck_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNoBranchOnAlgorithmNames: the layers around the algorithms ask an
// algorithm through core's capabilities (core/seam.go), never by its name,
// so adding an algorithm is adding its package.
func TestNoBranchOnAlgorithmNames(t *testing.T) {
	root := filepath.Join("..", "..")
	name := regexp.MustCompile(`\b(tokenbucket|slidingwindow|slidingcounter)\.Name\b|\.Name\(\) == "`)
	checked := 0
	for _, dir := range []string{"fallback", "reconcile", "config", "httplimit", "metrics", "cmd", "grpclimit"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			checked++
			for i, line := range strings.Split(string(src), "\n") {
				if name.MatchString(line) {
					t.Errorf("%s:%d branches on an algorithm's name: %s", path, i+1, strings.TrimSpace(line))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d files", checked)
	}
}
