// Package k8s is the Kubernetes matrix: the minors dynamig is built and tested on, read from
// versions.txt beside this file (the one place that lists them), and where each one's module
// file lives.
package k8s

import (
	_ "embed"
	"fmt"
	"path"
	"strings"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

//go:embed versions.txt
var versions string

// Status says how far a minor is supported.
type Status string

const (
	// Supported minors are built and tested in `make test`, and the chart installs on them.
	Supported Status = "supported"
	// Preview minors (a pre-release) are built and the plugin's framework-level tests run.
	Preview Status = "preview"
)

// Minor is one line of versions.txt.
type Minor struct {
	// Minor is "1.37".
	Minor string
	// Release is the k8s.io/kubernetes version, "v1.37.2".
	Release string
	Status  Status
	// Pins are the modules this minor's module file holds at a version of its own. Every other
	// module outside k8s.io is at the newest supported minor's version in every supported
	// minor's module file (`make modfiles`), so that it compiles once for all of them.
	Pins []module.Version
	// Base is set on the first supported minor, which go.mod builds.
	Base bool
}

// Staging is the version of the release's staging modules (k8s.io/api, …): v1.37.2 → v0.37.2.
func (m Minor) Staging() string { return "v0." + strings.TrimPrefix(m.Release, "v1.") }

// ModFile is the module file that builds the minor, relative to the repository root.
func (m Minor) ModFile() string {
	if m.Base {
		return "go.mod"
	}
	return path.Join("k8s", m.Minor, "go.mod")
}

// Matrix is versions.txt, in its order (oldest first).
func Matrix() ([]Minor, error) { return parse(versions) }

// Newest is the newest supported minor.
func Newest(ms []Minor) Minor {
	var n Minor
	for _, m := range ms {
		if m.Status == Supported {
			n = m
		}
	}
	return n
}

func parse(text string) ([]Minor, error) {
	var ms []Minor
	for i, line := range strings.Split(text, "\n") {
		if line, _, _ = strings.Cut(line, "#"); strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("versions.txt:%d: want minor, release and status, got %q", i+1, line)
		}
		m := Minor{Minor: f[0], Release: f[1], Status: Status(f[2])}
		if want := "v" + m.Minor + "."; !strings.HasPrefix(m.Release, want) || !semver.IsValid(m.Release) {
			return nil, fmt.Errorf("versions.txt:%d: release %q is not a release of %s", i+1, m.Release, m.Minor)
		}
		if m.Status != Supported && m.Status != Preview {
			return nil, fmt.Errorf("versions.txt:%d: status %q: want %s or %s", i+1, m.Status, Supported, Preview)
		}
		for _, r := range f[3:] {
			p, v, ok := strings.Cut(r, "@")
			if !ok || module.Check(p, v) != nil {
				return nil, fmt.Errorf("versions.txt:%d: %q: want module@version", i+1, r)
			}
			m.Pins = append(m.Pins, module.Version{Path: p, Version: v})
		}
		if len(ms) > 0 && semver.Compare(ms[len(ms)-1].Release, m.Release) >= 0 {
			return nil, fmt.Errorf("versions.txt:%d: %s is not newer than the line before", i+1, m.Release)
		}
		if m.Status == Supported && len(ms) > 0 && ms[len(ms)-1].Status == Preview {
			return nil, fmt.Errorf("versions.txt:%d: supported %s after a preview", i+1, m.Minor)
		}
		m.Base = m.Status == Supported && Newest(ms).Minor == ""
		ms = append(ms, m)
	}
	if Newest(ms).Minor == "" {
		return nil, fmt.Errorf("versions.txt: no supported minor")
	}
	return ms, nil
}
