package tokenbucket

import (
	_ "embed"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

//go:embed refund.lua
var refundSource string

var refundScript = driver.NewScript(Name+"_refund", driver.LuaIDiv+luaLife+refundSource, refundLocal)

var (
	_ driver.Peeker   = algorithm{}
	_ driver.Refunder = algorithm{}
)

func (algorithm) PeekScript() *driver.Script { return peekScript }

// RefundCall gives cost tokens back to the bucket skey (refund.lua).
func (algorithm) RefundCall(p core.Policy, skey string, cost int64, _ string, _ driver.Reply) driver.Call {
	return driver.Call{Script: refundScript, Keys: []string{skey},
		Args: driver.RefundArgs([]int64{p.Limit(), p.Interval().Microseconds(), cost})}
}

// refundLocal is refund.lua's Go twin.
func refundLocal(prev any, now int64, args []string) (any, []int64, int64, error) {
	v, err := driver.ParseArgs(args, 3, 3)
	if err != nil {
		return prev, nil, -1, err
	}
	c, t, n := v[0], v[1], v[2]
	if c < 1 || t < 1 || n < 1 || n > c {
		return prev, nil, -1, driver.Errorf(core.ErrInvalidPolicy, "token bucket refund: bad arguments %q", args)
	}
	st, ok := prev.(*State)
	if !ok {
		return nil, []int64{0}, 0, nil
	}
	full := c * t
	credit := st.At(now, full) + n*t
	if credit >= full {
		return nil, []int64{1}, 0, nil
	}
	return &State{Credit: credit, Last: now}, []int64{1}, full - credit, nil
}
