package machine

import (
	"os"
	"strings"
	"testing"
)

// TestCommand: the command names the runtime variables it ran with, then the arguments,
// quoted where a shell would read them.
func TestCommand(t *testing.T) {
	t.Setenv("GOGC", "400")
	t.Setenv("GOMEMLIMIT", "4GiB")
	os.Unsetenv("GOMAXPROCS")
	args := os.Args
	t.Cleanup(func() { os.Args = args })
	os.Args = []string{"cmd", "-out", "docs/benchmarks", "-mixed", ""}
	got := Command("go run ./test/bench/throughput/cmd")
	want := "GOGC=400 GOMEMLIMIT=4GiB go run ./test/bench/throughput/cmd -out docs/benchmarks -mixed ''"
	if got != want {
		t.Errorf("Command: %q, want %q", got, want)
	}
	os.Unsetenv("GOGC")
	os.Unsetenv("GOMEMLIMIT")
	if got := Command("go run x"); strings.Contains(got, "GO") {
		t.Errorf("Command without runtime variables: %q", got)
	}
}
