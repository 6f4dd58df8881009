package core_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

func TestPolicyValidation(t *testing.T) {
	tests := []struct {
		name string
		make func() (core.Policy, error)
	}{
		{"empty name", func() (core.Policy, error) { return tokenbucket.Policy("", 10, 1) }},
		{"name with colon", func() (core.Policy, error) { return tokenbucket.Policy("a:b", 10, 1) }},
		{"name with brace", func() (core.Policy, error) { return tokenbucket.Policy("a{b", 10, 1) }},
		{"name too long", func() (core.Policy, error) { return tokenbucket.Policy(strings.Repeat("n", 65), 10, 1) }},
		{"zero capacity", func() (core.Policy, error) { return tokenbucket.Policy("p", 0, 1) }},
		{"negative capacity", func() (core.Policy, error) { return tokenbucket.Policy("p", -5, 1) }},
		{"capacity above max", func() (core.Policy, error) { return tokenbucket.Policy("p", core.MaxLimit+1, 1) }},
		{"zero rate", func() (core.Policy, error) { return tokenbucket.Policy("p", 10, 0) }},
		{"negative rate", func() (core.Policy, error) { return tokenbucket.Policy("p", 10, -1) }},
		{"NaN rate", func() (core.Policy, error) { return tokenbucket.Policy("p", 10, math.NaN()) }},
		{"infinite rate", func() (core.Policy, error) { return tokenbucket.Policy("p", 10, math.Inf(1)) }},
		{"rate above 1e6/s", func() (core.Policy, error) { return tokenbucket.Policy("p", 10, 2e6) }},
		{"rate below one per year", func() (core.Policy, error) { return tokenbucket.Policy("p", 10, 1e-9) }},
		{"capacity times interval too large", func() (core.Policy, error) { return tokenbucket.Policy("p", core.MaxLimit, 1e-6) }},
		{"zero window", func() (core.Policy, error) { return slidingwindow.Policy("p", 10, 0) }},
		{"negative window", func() (core.Policy, error) { return slidingwindow.Policy("p", 10, -time.Second) }},
		{"window below 1ms", func() (core.Policy, error) { return slidingwindow.Policy("p", 10, 500*time.Microsecond) }},
		{"window of ten years", func() (core.Policy, error) { return slidingwindow.Policy("p", 10, 10*365*24*time.Hour) }},
		{"sub-microsecond window", func() (core.Policy, error) { return slidingwindow.Policy("p", 10, time.Second+1) }},
		{"window limit above max", func() (core.Policy, error) { return slidingwindow.Policy("p", slidingwindow.MaxLimit+1, time.Second) }},
		{"nil algorithm", func() (core.Policy, error) { return driver.NewPolicy("p", nil, 1, time.Second) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := tt.make()
			if !errors.Is(err, core.ErrInvalidPolicy) {
				t.Fatalf("err = %v, want ErrInvalidPolicy", err)
			}
			if p.Valid() {
				t.Fatalf("invalid policy came back valid: %v", p)
			}
		})
	}
}

func TestPolicyNumbers(t *testing.T) {
	p, err := tokenbucket.Policy("api", 20, 5)
	if err != nil {
		t.Fatal(err)
	}
	if p.Limit() != 20 || p.Interval() != 200*time.Millisecond || tokenbucket.Rate(p) != 5 {
		t.Fatalf("got %v, rate %v", p, tokenbucket.Rate(p))
	}
	if got := p.String(); got != "api(token_bucket 20 per 200ms)" {
		t.Fatalf("String = %q", got)
	}
	third, _ := tokenbucket.Policy("third", 1, 3)
	if third.Interval() != 333333*time.Microsecond {
		t.Fatalf("3/s interval = %v", third.Interval())
	}
}

func newLimiter(t *testing.T) *core.Limiter {
	t.Helper()
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	l, err := core.NewLimiter(s, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestBadRequests(t *testing.T) {
	l := newLimiter(t)
	tb, _ := tokenbucket.Policy("tb", 10, 1)
	sw, _ := slidingwindow.Policy("sw", 5, time.Second)
	tests := []struct {
		name string
		p    core.Policy
		key  string
		cost int64
		want error
	}{
		{"zero cost", tb, "k", 0, core.ErrInvalidCost},
		{"negative cost", sw, "k", -1, core.ErrInvalidCost},
		{"cost above capacity", tb, "k", 11, core.ErrCostExceedsLimit},
		{"cost above window limit", sw, "k", 6, core.ErrCostExceedsLimit},
		{"empty key", tb, "", 1, core.ErrEmptyKey},
		{"key too long", sw, strings.Repeat("k", core.MaxKeyLen+1), 1, core.ErrKeyTooLong},
		{"zero policy", core.Policy{}, "k", 1, core.ErrInvalidPolicy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := l.AllowN(context.Background(), tt.p, tt.key, tt.cost)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if r.Allowed {
				t.Fatal("bad request admitted")
			}
		})
	}
	// The boundary values are accepted.
	if r, err := l.AllowN(context.Background(), tb, strings.Repeat("k", core.MaxKeyLen), 10); err != nil || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("max key, full cost: %+v, %v", r, err)
	}
	if r, err := l.Allow(context.Background(), sw, "\x00binary\xff"); err != nil || !r.Allowed || r.Remaining != 4 {
		t.Fatalf("binary key: %+v, %v", r, err)
	}
}

func TestUnknownPolicy(t *testing.T) {
	tb, _ := tokenbucket.Policy("tb", 10, 1)
	ps := core.Policies{"tb": tb}
	if _, err := ps.Lookup("nope"); !errors.Is(err, core.ErrUnknownPolicy) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("err = %v", err)
	}
	if p, err := ps.Lookup("tb"); err != nil || p.Name() != "tb" {
		t.Fatalf("Lookup(tb) = %v, %v", p, err)
	}
}

func TestBadPrefix(t *testing.T) {
	s, _ := memory.New(memory.Options{})
	defer s.Close()
	if _, err := core.NewLimiter(s, core.Options{Prefix: "a{"}); err == nil {
		t.Fatal("prefix with a brace accepted")
	}
	if _, err := core.NewLimiter(nil, core.Options{}); err == nil {
		t.Fatal("nil store accepted")
	}
}

func TestStorageKeyHashTag(t *testing.T) {
	if got := driver.StorageKey("hf:", "api", "client-7"); got != "hf:{api:client-7}" {
		t.Fatalf("StorageKey = %q", got)
	}
}

func TestParseReply(t *testing.T) {
	bad := [][]int64{nil, {1, 2, 3, 4}, {2, 0, 0, 0, 1}, {1, 0, -1, 0, 1}, {1, 0, 0, 0, 0}, {1, 2, 3, 4, 5, 6}}
	for _, r := range bad {
		if _, err := driver.ParseReply(r); !errors.Is(err, core.ErrMalformedReply) {
			t.Errorf("ParseReply(%v) err = %v, want ErrMalformedReply", r, err)
		}
	}
	got, err := driver.ParseReply([]int64{1, 7, 0, 900, 42})
	if err != nil || got != (driver.Reply{Allowed: true, Remaining: 7, ResetAfter: 900, Now: 42}) {
		t.Fatalf("ParseReply = %+v, %v", got, err)
	}
}

func TestLimiterLocalMode(t *testing.T) {
	l := newLimiter(t)
	p, _ := tokenbucket.Policy("tb", 2, 1)
	var admitted int
	for range 5 {
		r, err := l.Allow(context.Background(), p, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if r.Mode != core.ModeLocal || r.Limit != 2 {
			t.Fatalf("result %+v", r)
		}
		if r.Allowed {
			admitted++
		} else if r.RetryAfter <= 0 || r.RetryAfter > time.Second {
			t.Fatalf("denial RetryAfter = %v", r.RetryAfter)
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d of 5 within one instant, want capacity 2", admitted)
	}
}

// TestSmallDefects: an error's Result says no mode; a nil store and a nil
// context are named errors, not ErrInvalidPolicy or a panic.
func TestSmallDefects(t *testing.T) {
	if got := (core.Result{}).Mode.String(); got != "none" {
		t.Errorf("zero Result's mode %q, want none", got)
	}
	if _, err := core.NewLimiter(nil, core.Options{}); err == nil || errors.Is(err, core.ErrInvalidPolicy) || !strings.Contains(err.Error(), "nil store") {
		t.Errorf("NewLimiter(nil): %v, want a nil-store error", err)
	}
	l := newLimiter(t)
	p, _ := tokenbucket.Policy("tb", 2, 1)
	r, err := l.Allow(nil, p, "alice")
	if !errors.Is(err, core.ErrNilContext) || r.Mode != core.ModeNone || core.ClassOf(err) != core.ClassRequest {
		t.Errorf("nil context: %+v %v, want ErrNilContext (a request error) and mode none", r, err)
	}
}

// replyStore answers every call with one admitting decision reply.
type replyStore struct{}

func (replyStore) Run(context.Context, *driver.Script, []string, []string) ([]int64, error) {
	return []int64{1, 4, 0, 1000, 42}, nil
}

// TestSharedStoreModeIsRedis: a decision through a store that is not in
// this process says so.
func TestSharedStoreModeIsRedis(t *testing.T) {
	l, err := core.NewLimiter(replyStore{}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := tokenbucket.Policy("tb", 5, 1)
	r, err := l.Allow(context.Background(), p, "k")
	if err != nil || r.Mode != core.ModeRedis || !r.Allowed || r.Remaining != 4 {
		t.Fatalf("%+v %v, want allowed, 4 left, mode redis", r, err)
	}
}

// TestGoverning: the first denial speaks for an AllowAll, else the
// admission with the least remaining.
func TestGoverning(t *testing.T) {
	rs := []core.Result{{Allowed: true, Remaining: 5}, {Allowed: true, Remaining: 2}, {Allowed: true, Remaining: 3}}
	if g := core.Governing(rs); g != 1 {
		t.Fatalf("all admitted: %d, want 1 (2 left)", g)
	}
	rs[2].Allowed, rs[0].Allowed = false, false
	if g := core.Governing(rs); g != 0 {
		t.Fatalf("two denials: %d, want the first, 0", g)
	}
}
