package harness

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where the figures were taken.
type Machine struct {
	CPUs       int
	Model      string
	MemTotal   string
	Kernel     string
	GoVersion  string
	Redis      string
	GOMAXPROCS int
	// Load is /proc/loadavg's 1, 5 and 15 minute averages when the run
	// started: other work on a shared machine shows here.
	Load string
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), Load: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.Model = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(v)
				if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
					m.MemTotal = strconv.FormatFloat(kb/(1<<20), 'f', 1, 64) + " GiB"
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		m.Redis = strings.TrimSpace(string(out))
	}
	return m
}
