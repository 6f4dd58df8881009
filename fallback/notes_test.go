package fallback_test

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// notes are the figures of the tests that are not fault rows (key flood,
// TLS, ACL), written under the table of docs/RELIABILITY.md.
var (
	notesMu sync.Mutex
	notes   = map[string][]string{}
)

// note records one line under section.
func note(section, line string) {
	notesMu.Lock()
	notes[section] = append(notes[section], line)
	notesMu.Unlock()
}

// notesText renders the notes, sections and lines sorted.
func notesText() string {
	notesMu.Lock()
	defer notesMu.Unlock()
	var b strings.Builder
	for _, sec := range slices.Sorted(func(yield func(string) bool) {
		for k := range notes {
			if !yield(k) {
				return
			}
		}
	}) {
		b.WriteString("### " + sec + "\n\n")
		lines := slices.Clone(notes[sec])
		slices.Sort(lines)
		for _, l := range lines {
			b.WriteString("- " + l + "\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// rssBytes is this process's resident set size (VmRSS), or 0 where
// /proc/self/status cannot be read.
func rssBytes() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
