package driver_test

import (
	"context"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// TestSplitMany: a Many reply splits into each decision's reply, nil for
// one refused at its deadline; a reply of another length or an unknown
// status is not one.
func TestSplitMany(t *testing.T) {
	reply := []int64{0, 1, 2, 0, 5, 9, driver.ManyStale, 0, 0, 0, 0, 0, 0, 0, 7, 3, 4, 9}
	got, ok := driver.SplitMany(reply, 3)
	if !ok || len(got) != 3 || !slices.Equal(got[0], []int64{1, 2, 0, 5, 9}) || got[1] != nil || !slices.Equal(got[2], []int64{0, 7, 3, 4, 9}) {
		t.Fatalf("SplitMany = %v, %v", got, ok)
	}
	if _, ok := driver.SplitMany(reply, 2); ok {
		t.Error("a reply of 3 decisions split as 2")
	}
	bad := slices.Clone(reply)
	bad[driver.ManyStride] = 2
	if _, ok := driver.SplitMany(bad, 3); ok {
		t.Error("status 2 accepted")
	}
}

// TestKeysFailsKeyAlone: in a Keys call, a key whose one fails after it
// has appended its decisions' replies (a command's error midway) gets
// driver.ManyAlone for each of its decisions and nothing else of its in
// the reply, and the keys around it keep their replies in their places;
// an error reply of one does the same. The source decides cost n as the
// five integers n, 0, 0, 0, 0, then fails on the keys named "raise" and
// "reply".
func TestKeysFailsKeyAlone(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	m := driver.NewMany("keysfail", driver.LuaManyHelpers+`
local function one(key, first, last)
  decide_each(first, last, function(i)
    return 0 + ARGV[i], 0, 0, 0, 0
  end)
  if key == 'raise' then
    redis.call('LPUSH', 'str', 'x')
  elseif key == 'reply' then
    return redis.error_reply('ERR refused')
  end
end
`, 1, 1)
	ctx := context.Background()
	if err := rc.Set(ctx, "str", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "raise", "b", "reply", "c"}
	args := []any{"shared", "1", "7", "", "2", "8", "", "9", "", "1", "3", "", "1", "4", "", "2", "5", "", "6", ""}
	v, err := rc.Eval(ctx, m.Keys.Source(), keys, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	alone := []int64{driver.ManyAlone, 0, 0, 0, 0, 0}
	var want []int64
	for _, d := range [][]int64{{0, 7, 0, 0, 0, 0}, alone, alone, {0, 3, 0, 0, 0, 0}, alone, {0, 5, 0, 0, 0, 0}, {0, 6, 0, 0, 0, 0}} {
		want = append(want, d...)
	}
	if !slices.Equal(v, want) {
		t.Fatalf("reply\n%v, want\n%v", v, want)
	}
}
