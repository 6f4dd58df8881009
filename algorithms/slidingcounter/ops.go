package slidingcounter

import (
	_ "embed"

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

// RefundCall takes cost units off the window the admission with reply r
// was counted in (refund.lua).
func (algorithm) RefundCall(p core.Policy, skey string, cost int64, _ string, r driver.Reply) driver.Call {
	return driver.Call{Script: refundScript, Keys: []string{skey},
		Args: driver.RefundArgs([]int64{p.Interval().Microseconds(), cost, r.Now})}
}

// refundLocal is refund.lua's Go twin, on the state in place.
func refundLocal(prev any, _ int64, args []string) (any, []int64, int64, error) {
	v, err := driver.ParseArgs(args, 3, 3)
	if err != nil {
		return prev, nil, -1, err
	}
	w, n, at := v[0], v[1], v[2]
	if w < 1 || n < 1 || at < 0 {
		return prev, nil, -1, driver.Errorf(core.ErrInvalidPolicy, "sliding window counter refund: bad arguments %q", args)
	}
	st, ok := prev.(*State)
	if !ok {
		return prev, []int64{0}, -1, nil
	}
	j := at / w
	var took int64
	switch st.Window {
	case j:
		took = min(st.Cur, n)
		st.Cur -= took
	case j + 1:
		took = min(st.Prev, n)
		st.Prev -= took
	}
	return st, []int64{took}, -1, nil
}
