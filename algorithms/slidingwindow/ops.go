package slidingwindow

import (
	_ "embed"
	"slices"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

//go:embed refund.lua
var refundSource string

var refundScript = driver.NewScript(Name+"_refund", refundSource, refundLocal)

var (
	_ driver.Peeker   = algorithm{}
	_ driver.Refunder = algorithm{}
)

func (algorithm) PeekScript() *driver.Script { return peekScript }

// RefundCall removes the members of request id from the window skey
// (refund.lua).
func (algorithm) RefundCall(_ core.Policy, skey string, cost int64, id string, r driver.Reply) driver.Call {
	return driver.Call{Script: refundScript, Keys: []string{skey}, Args: driver.RefundArgs([]int64{cost, r.Now}, id)}
}

// refundLocal is refund.lua's Go twin: the memory store keeps times, not
// ids, so it removes n units admitted at the admission's time.
func refundLocal(prev any, _ int64, args []string) (any, []int64, int64, error) {
	if len(args) != 3 || args[2] == "" {
		return prev, nil, -1, driver.Errorf(core.ErrInvalidPolicy, "sliding window refund: bad arguments %q", args)
	}
	v, err := driver.ParseArgs(args[:2], 2, 2)
	if err != nil {
		return prev, nil, -1, err
	}
	n, at := v[0], v[1]
	l, ok := prev.(*Log)
	if !ok || n < 1 {
		return prev, []int64{0}, -1, nil
	}
	removed := int64(0)
	for i := len(l.At) - 1; i >= 0 && removed < n; i-- {
		if l.At[i] == at {
			l.At = slices.Delete(l.At, i, i+1)
			removed++
		}
	}
	return l, []int64{removed}, -1, nil
}
