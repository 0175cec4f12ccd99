// Package machine describes the machine a benchmark runs on, for its report.
package machine

import (
	"bufio"
	"os"
	"strings"
)

// CPUModel is the first "model name" of /proc/cpuinfo.
func CPUModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// Command is the command line that ran a benchmark, as a shell would take it back: prefix
// (e.g. "go run ./test/bench/packing/cmd") and os.Args[1:], each quoted when it is empty or
// holds characters a shell would interpret.
func Command(prefix string) string {
	parts := []string{prefix}
	for _, a := range os.Args[1:] {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~!") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}
