package rls_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/holdfast/holdfast/cmd/demo/serve/rls"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
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

// FuzzPlan: requests from outside (domain, entries, hits) against the
// README's configs are planned or refused with a RequestError, never a
// panic; a planned descriptor's key is never empty nor above
// core.MaxKeyLen, and a limit is only ever matched whole.
func FuzzPlan(f *testing.F) {
	c, err := rls.LoadPath("testdata/readme")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("messaging", "message_type", "marketing", "to_number", "2061111111", uint32(0), uint8(2))
	f.Add("example9", "route", "/api/v1/resource/1/action", "", "", uint32(3), uint8(1))
	f.Add("", "", "", "", "", uint32(0), uint8(0))
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, hits uint32, n uint8) {
		es := []rls.Entry{{Key: k1, Value: v1}, {Key: k2, Value: v2}}[:min(int(n), 2)]
		items, _, err := c.Plan(domain, []rls.Descriptor{{Entries: es}, {Entries: es[:min(len(es), 1)]}}, hits)
		if err != nil {
			var re *rls.RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %v is not a RequestError", err)
			}
			return
		}
		for _, it := range items {
			if it.Limit != nil && (it.Key == "" || len(it.Key) > core.MaxKeyLen) {
				t.Fatalf("key %q", it.Key)
			}
			if it.Limit != nil && it.Limit.Policy.Valid() {
				if err := driver.CheckRequest(it.Limit.Policy, it.Key, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
