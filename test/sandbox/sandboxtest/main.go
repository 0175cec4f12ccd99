package sandboxtest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dynamig/dynamig/test/cluster"
)

// Main is a sandbox suite's TestMain: quiet component logs unless -v, then each command the
// suite runs as a user does, built into a temporary directory (a command package of this
// module, keyed by import path, whose path variable is left as it is when already set, e.g.
// from the environment); then the tests, and exit with their code.
func Main(m *testing.M, commands map[string]*string) {
	flag.Parse()
	cluster.QuietLogs(testing.Verbose())
	dir, err := os.MkdirTemp("", "sandbox-suite-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for pkg, path := range commands {
		if *path != "" {
			continue
		}
		*path = filepath.Join(dir, filepath.Base(pkg))
		if out, err := exec.Command("go", "build", "-ldflags=-w", "-o", *path, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
