package harness

import (
	"strings"
	"testing"
)

func TestParseStoreVariant(t *testing.T) {
	v, err := ParseStoreVariant("nocollapse+keysdepth=-1+keysfrom=8+pipelines=2+maxbatch=64+pool=8+nocoalesce")
	if err != nil {
		t.Fatal(err)
	}
	want := StoreVariant{Spec: v.Spec, KeysDepth: -1, KeysFrom: 8, NoCollapse: true, NoCoalesce: true, Pipelines: 2, MaxBatch: 64, PoolSize: 8}
	if v != want {
		t.Fatalf("got %+v, want %+v", v, want)
	}
	if !v.goredisOnly() {
		t.Fatal("a variant with go-redis options is not go-redis only")
	}
	both, err := ParseStoreVariant("keysdepth=4")
	if err != nil || both.KeysDepth != 4 || both.goredisOnly() {
		t.Fatalf("keysdepth=4: %+v, %v", both, err)
	}
	if rows := variantImpls([]StoreVariant{both, v}); len(rows) != 3 {
		t.Fatalf("rows: got %d, want 3 (keysdepth on both backends, the go-redis variant on one)", len(rows))
	}
	kd := variantImpls(keysDepthVariants([]int{-1}))
	if len(kd) != 2 || kd[0].name != implHFRueidisTB+", keys depth -1" || kd[1].name != implHFGoredisTB+", keys depth -1" {
		t.Fatalf("-keys-depths -1 rows: %v", kd)
	}
	for _, bad := range []struct{ spec, says string }{
		{"", "empty"},
		{"fast", `unknown option "fast"`},
		{"keysdepth", "needs =N"},
		{"keysdepth=0", "is the default"},
		{"keysdepth=-2", "not an integer ≥ -1"},
		{"pipelines=0", "not an integer ≥ 1"},
		{"keysfrom=0", "not an integer ≥ 1"},
		{"pool=x", "not an integer"},
		{"nocollapse=1", "takes no value"},
	} {
		_, err := ParseStoreVariant(bad.spec)
		if err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%q: got %v, want an error saying %q", bad.spec, err, bad.says)
		}
	}
}
