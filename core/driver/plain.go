package driver

import "context"

// A PlainReplayer is a FreshReplayer whose replay adds nothing twice: a
// batch applied a second time, by any path, leaves its key as once (the
// sliding window's units are members named by their request ids). Such a
// batch needs neither a script nor a marker: the reconciler
// (reconcile.Options.FreshMin) sends its writes as plain commands to a
// store that is a Commander, a batch whose writes failed with a reply of
// Redis goes to the scripts, and one whose reply was lost is sent again.
type PlainReplayer interface {
	FreshReplayer
	// PlainWrites appends to w, with AppendFresh, commands that apply
	// batch b to its key whether the key exists or not, as its replay
	// script would, and that change nothing when they run again. now is a
	// lower bound of the Redis time at which they run, as for FreshWrites.
	// ok false sends the batch to the fresh or replay script (a batch that
	// writes only into a missing key, such as a seed, or a batch too
	// large).
	PlainWrites(w []string, b *Batch, o ReplayOptions, now int64) (out []string, ok bool)
}

// A Commander is a Store that can send plain commands, pipelined: the
// writes of PlainReplayer batches. Each command is its name, its key and
// its arguments. RunCommands runs them in their order (a command after
// the ones before it on its key), and returns each command's error,
// mapped as Run maps errors (nil: it succeeded, whatever it replied). Like Run it does
// not retry, and a command that failed after it was sent has an unknown
// outcome.
type Commander interface {
	RunCommands(ctx context.Context, cmds [][]string) []error
}
