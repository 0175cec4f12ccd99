// Package version is what every dynamig binary says of itself with --version: dynamig's
// version and commit, stamped at link time, and the Kubernetes version it is built on.
package version

import (
	"fmt"
	"os/exec"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Set by the linker (the Makefile and the Dockerfiles):
//
//	-X github.com/dynamig/dynamig/version.version=v0.1.0 -X github.com/dynamig/dynamig/version.commit=<sha>
var (
	version = "dev"
	commit  = ""
)

// Info describes a build.
type Info struct {
	// Version is dynamig's version ("dev" when not stamped).
	Version string
	// Commit is the git commit built: the stamped one, else the one the go command recorded
	// (with "-dirty" for uncommitted changes), else "unknown".
	Commit string
	// Kubernetes is the Kubernetes release the binary's Kubernetes code comes from.
	Kubernetes string
	// Go is the Go version that built it.
	Go string
}

// Get describes this binary.
func Get() Info {
	info := Info{Version: version, Commit: commit, Kubernetes: "unknown", Go: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if info.Commit == "" {
			info.Commit = "unknown"
		}
		return info
	}
	info.Go = bi.GoVersion
	info.Kubernetes = kubernetes(bi.Deps)
	if info.Commit == "" {
		info.Commit = "unknown"
		var revision, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if revision != "" {
			info.Commit = revision
			if modified == "true" {
				info.Commit += "-dirty"
			}
		}
	}
	return info
}

// kubernetes is the Kubernetes release of deps: k8s.io/kubernetes's version where the binary
// links it, else that of client-go, whose v0.X.Y is Kubernetes v1.X.Y.
func kubernetes(deps []*debug.Module) string {
	find := func(path string) string {
		for _, d := range deps {
			if d.Path == path {
				if d.Replace != nil && d.Replace.Version != "" {
					return d.Replace.Version
				}
				return d.Version
			}
		}
		return ""
	}
	if v := find("k8s.io/kubernetes"); v != "" {
		return v
	}
	if v := find("k8s.io/client-go"); strings.HasPrefix(v, "v0.") {
		return "v1." + strings.TrimPrefix(v, "v0.")
	}
	return "unknown"
}

// KubernetesRelease is the k8s.io/kubernetes release this code is built with ("v1.37.2"):
// Get's, or, in a test binary (which carries no module list), the go command's answer for
// the module file in use (GOFLAGS' -modfile).
func KubernetesRelease() (string, error) {
	if v := Get().Kubernetes; v != "unknown" {
		return v, nil
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", "k8s.io/kubernetes").Output()
	if err != nil {
		return "", fmt.Errorf("the k8s.io/kubernetes release built with: go list -m: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// String is the --version line of component.
func (i Info) String(component string) string {
	return fmt.Sprintf("%s %s (commit %s, Kubernetes %s, %s)", component, i.Version, i.Commit, i.Kubernetes, i.Go)
}

// AddFlag gives cmd a --version flag unless the process has one already: component-base's
// (k8s.io/component-base/version/verflag registers itself on pflag.CommandLine, which cobra
// merges into every command), whose values are false, true and raw.
func AddFlag(cmd *cobra.Command) {
	if pflag.CommandLine.Lookup("version") == nil {
		cmd.Flags().Bool("version", false, "print the version, the commit and the Kubernetes version, and exit")
	}
}

// Requested reports whether cmd was run with --version.
func Requested(cmd *cobra.Command) bool {
	f := cmd.Flags().Lookup("version")
	return f != nil && f.Value.String() != "false"
}
