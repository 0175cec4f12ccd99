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

// runtimeEnv are the variables of the environment that change how the Go runtime runs a
// benchmark (its collector, its threads): a command that ran with them says so.
var runtimeEnv = []string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS"}

// Command is the command line that ran a benchmark, as a shell would take it back: the
// runtime variables set in the environment (runtimeEnv), prefix (e.g. "go run
// ./test/bench/packing/cmd") and os.Args[1:], each quoted when it is empty or holds
// characters a shell would interpret.
func Command(prefix string) string {
	var parts []string
	for _, k := range runtimeEnv {
		if v, ok := os.LookupEnv(k); ok {
			parts = append(parts, k+"="+quote(v))
		}
	}
	parts = append(parts, prefix)
	for _, a := range os.Args[1:] {
		parts = append(parts, quote(a))
	}
	return strings.Join(parts, " ")
}

func quote(a string) string {
	if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~!") {
		return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return a
}
