package rls_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/holdfast/holdfast/cmd/demo/serve/rls"
)

func writeFile(name, src string) error { return os.WriteFile(name, []byte(src), 0o644) }

// FuzzLoad: any input loads or fails with an error, never a panic, and a
// config that loads matches any request without a panic.
func FuzzLoad(f *testing.F) {
	files, _ := filepath.Glob("testdata/readme/*.yaml")
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err == nil {
			f.Add(b, "k", "v")
		}
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    value: x*y*\n    rate_limit: {unit: second, requests_per_unit: 0}\n"), "a", "xyy")
	f.Fuzz(func(t *testing.T, src []byte, key, value string) {
		c, err := rls.Load(src, "fuzz.yaml")
		if err != nil {
			return
		}
		for _, dom := range c.Domains() {
			c.Plan(dom, []rls.Descriptor{{Entries: []rls.Entry{{Key: key, Value: value}, {Key: key, Value: value}}}, {Entries: []rls.Entry{{Key: key, Value: value}}}}, 1)
		}
	})
}
