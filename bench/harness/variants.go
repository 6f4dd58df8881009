package harness

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/holdfast/holdfast/backend/goredis"
	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core/driver"
)

// A StoreVariant is a set of store and client options that section 1
// measures beside the defaults: rows of holdfast's token bucket with them,
// on each backend the options apply to, interleaved with the other rows of
// the run. It makes a tuning question a command anyone can rerun (bench's
// -store-variants) instead of an edited constant.
type StoreVariant struct {
	Spec       string // as given: the rows' names end with it
	KeysDepth  int    // StoreOptions.KeysDepth (both backends); 0: the default
	KeysFrom   int    // StoreOptions.KeysFrom (both); 0: the default
	NoCollapse bool   // StoreOptions.NoCollapse (both)
	NoCoalesce bool   // goredis.StoreOptions.NoCoalesce (go-redis only)
	Pipelines  int    // goredis.StoreOptions.Pipelines (go-redis only)
	MaxBatch   int    // goredis.StoreOptions.MaxBatch (go-redis only)
	PoolSize   int    // goredis.ClientOptions.PoolSize (go-redis only)
}

// goredisOnly reports whether v sets an option that only the go-redis
// store has: its rueidis row would be the defaults again, so it has none.
func (v StoreVariant) goredisOnly() bool {
	return v.NoCoalesce || v.Pipelines != 0 || v.MaxBatch != 0 || v.PoolSize != 0
}

// ParseStoreVariant parses spec, options joined by '+': keysdepth=N
// (negative: no calls of several keys), keysfrom=N, nocollapse,
// nocoalesce, pipelines=N, maxbatch=N, pool=N. For example "nocollapse+keysdepth=-1".
func ParseStoreVariant(spec string) (StoreVariant, error) {
	v := StoreVariant{Spec: spec}
	if spec == "" {
		return v, fmt.Errorf("store variant: empty")
	}
	for _, opt := range strings.Split(spec, "+") {
		name, val, hasVal := strings.Cut(opt, "=")
		num := func(min int) (int, error) {
			if !hasVal {
				return 0, fmt.Errorf("store variant %q: %s needs =N", spec, name)
			}
			n, err := strconv.Atoi(val)
			if err != nil || n < min {
				return 0, fmt.Errorf("store variant %q: %s=%q is not an integer ≥ %d", spec, name, val, min)
			}
			return n, nil
		}
		flag := func() error {
			if hasVal {
				return fmt.Errorf("store variant %q: %s takes no value", spec, name)
			}
			return nil
		}
		var err error
		switch name {
		case "keysdepth":
			if v.KeysDepth, err = num(-1); err == nil && v.KeysDepth == 0 {
				err = fmt.Errorf("store variant %q: keysdepth=0 is the default; give -1 or a depth ≥ 1", spec)
			}
		case "keysfrom":
			v.KeysFrom, err = num(1)
		case "nocollapse":
			v.NoCollapse, err = true, flag()
		case "nocoalesce":
			v.NoCoalesce, err = true, flag()
		case "pipelines":
			v.Pipelines, err = num(1)
		case "maxbatch":
			v.MaxBatch, err = num(1)
		case "pool":
			v.PoolSize, err = num(1)
		default:
			err = fmt.Errorf("store variant %q: unknown option %q (keysdepth=N, keysfrom=N, nocollapse, nocoalesce, pipelines=N, maxbatch=N, pool=N)", spec, name)
		}
		if err != nil {
			return StoreVariant{}, err
		}
	}
	return v, nil
}

// keysDepthVariants are the variants of -keys-depths: each depth alone,
// its rows named "…, keys depth N" as before -store-variants.
func keysDepthVariants(depths []int) []StoreVariant {
	var out []StoreVariant
	for _, d := range depths {
		out = append(out, StoreVariant{Spec: fmt.Sprintf("keys depth %d", d), KeysDepth: d})
	}
	return out
}

// variantImpls are section 1's rows for the store variants vs: holdfast's
// token bucket on each backend a variant applies to.
func variantImpls(vs []StoreVariant) []limiterImpl {
	var out []limiterImpl
	for _, v := range vs {
		if !v.goredisOnly() {
			out = append(out, limiterImpl{name: implHFRueidisTB + ", " + v.Spec, open: coreOn(hiTB, func(url string) (driver.Store, func(), error) {
				c, err := hfrueidis.NewClient(url, hfrueidis.ClientOptions{})
				if err != nil {
					return nil, nil, err
				}
				return hfrueidis.NewWithOptions(c, hfrueidis.StoreOptions{KeysDepth: v.KeysDepth, KeysFrom: v.KeysFrom, NoCollapse: v.NoCollapse}), c.Close, nil
			})})
		}
		out = append(out, limiterImpl{name: implHFGoredisTB + ", " + v.Spec, open: coreOn(hiTB, func(url string) (driver.Store, func(), error) {
			c, err := goredis.NewClient(url, goredis.ClientOptions{PoolSize: v.PoolSize})
			if err != nil {
				return nil, nil, err
			}
			o := goredis.StoreOptions{KeysDepth: v.KeysDepth, KeysFrom: v.KeysFrom, NoCollapse: v.NoCollapse, NoCoalesce: v.NoCoalesce, Pipelines: v.Pipelines, MaxBatch: v.MaxBatch}
			return goredis.NewWithOptions(c, o), func() { _ = c.Close() }, nil
		})})
	}
	return out
}
