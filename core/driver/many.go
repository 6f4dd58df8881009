package driver

import "strings"

// Many is a script that makes several decisions on one key in one call:
// the decisions of a decision script s (NewDecisionScript) that arrive
// while others of s on that key are in flight. A store may send them
// together in one call of s's Many (s.WithMany gives it; the Redis stores
// do, through pipeline.Decisions): one EVALSHA, one read and one write of
// the key for all of them, where each would pay its own, so a hot key's
// concurrent callers share a round trip and a fraction of the Redis time. The
// decisions are made in order, at one instant of Redis time, each as s
// would make it alone at that instant.
//
// Call layout:
//
//	KEYS   the decisions' keys (they are the same for all)
//	ARGV   Shared arguments, equal in every decision's call of s; then
//	       for each decision its Each arguments, which follow the shared
//	       ones in its call of s, and its deadline: its DeadlineArg, or
//	       "" when it has none
//
// Reply: for each decision, in order, six integers: 0 and its reply as s
// gives it; or 1 and five zeros when its deadline had passed, and it was
// not decided (the guard's STALE). An error reply is the error of every
// decision: the script must then have written nothing.
type Many struct {
	Script       *Script
	Shared, Each int
}

// WithMany gives decision script s its Many, m, and returns s. It is
// called once, where s is made.
func (s *Script) WithMany(m *Many) *Script {
	s.many = m
	return s
}

// Many returns s's Many, or nil.
func (s *Script) Many() *Many { return s.many }

// Fits reports whether a call of the Many's decision script with args
// can be one of its decisions: it has the Shared and Each arguments and
// nothing else but a DeadlineArg.
func (m *Many) Fits(args []string) bool {
	return len(TrimDeadline(args)) == m.Shared+m.Each
}

// SameShared reports whether two calls' shared arguments are equal.
func (m *Many) SameShared(a, b []string) bool {
	for i := range m.Shared {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// AppendDecision appends the arguments of one decision, a call of the
// decision script with args, to those of a Many call.
func (m *Many) AppendDecision(out, args []string) []string {
	d := ""
	if n := len(args); n > 0 && strings.HasPrefix(args[n-1], "@") {
		d = args[n-1]
	}
	out = append(out, args[m.Shared:m.Shared+m.Each]...)
	return append(out, d)
}
