package redact

import (
	"errors"
	"strings"
	"testing"
)

func TestURLError(t *testing.T) {
	for _, u := range []string{
		"redis://:sekrit@127.0.0.1:bad/0",
		"rediss://user:sekrit@[::1",
		"redis://user:sekrit@host:1?dial_timeout=x",
	} {
		err := URLError(u, errors.New(`parse "`+u+`": bad sekrit`))
		if strings.Contains(err.Error(), "sekrit") || !strings.Contains(err.Error(), Mask) {
			t.Errorf("%q: %v", u, err)
		}
	}
	if URLError("redis://host", nil) != nil {
		t.Error("nil error not kept")
	}
}
