package repo

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	goversion "go/version"

	"golang.org/x/mod/modfile"

	"github.com/dynamig/dynamig/k8s"
)

// TestKubernetesMatrix: everything that names the supported Kubernetes minors follows
// k8s/versions.txt: go.mod builds the base minor; each other minor has its module file, with
// k8s.io/kubernetes and every staging module pinned to its release and the modules its line pins
// at their versions, every other module outside k8s.io at the newest supported minor's version
// (what `make modfiles` writes); the chart's kubeVersion is the supported range; the README's
// support table has a row per minor with its release and status.
func TestKubernetesMatrix(t *testing.T) {
	ms, err := k8s.Matrix()
	if err != nil {
		t.Fatal(err)
	}
	newest := readModFile(t, k8s.Newest(ms).ModFile())
	var supported []string
	for _, m := range ms {
		if m.Status == k8s.Supported {
			supported = append(supported, m.Minor)
		}
		f := readModFile(t, m.ModFile())
		pinned := map[string]string{}
		for _, p := range m.Pins {
			pinned[p.Path] = p.Version
		}
		for _, r := range f.Require {
			if want, ok := pinned[r.Mod.Path]; ok {
				if r.Mod.Version != want {
					t.Errorf("%s: %s %s, but k8s/versions.txt pins %s: run `make modfiles`", m.ModFile(), r.Mod.Path, r.Mod.Version, want)
				}
				continue
			}
			if m.Status != k8s.Supported || strings.HasPrefix(r.Mod.Path, "k8s.io/") {
				continue
			}
			for _, n := range newest.Require {
				if n.Mod.Path == r.Mod.Path && n.Mod.Version != r.Mod.Version {
					t.Errorf("%s: %s %s, but the newest minor has %s, which every supported minor shares so that it compiles once: run `make modfiles`, or pin it in k8s/versions.txt where this minor's release needs its own",
						m.ModFile(), r.Mod.Path, r.Mod.Version, n.Mod.Version)
				}
			}
		}
		for _, r := range f.Require {
			if r.Mod.Path == "k8s.io/kubernetes" && r.Mod.Version != m.Release {
				t.Errorf("%s: k8s.io/kubernetes %s, want %s: run `make modfiles`", m.ModFile(), r.Mod.Version, m.Release)
			}
		}
		for _, r := range f.Replace {
			if strings.HasPrefix(r.Old.Path, "k8s.io/") && r.New.Version != m.Staging() {
				t.Errorf("%s: %s => %s %s, want %s: run `make modfiles`", m.ModFile(), r.Old.Path, r.New.Path, r.New.Version, m.Staging())
			}
		}
		if !m.Base {
			if _, err := os.Stat(filepath.Join(root, strings.TrimSuffix(m.ModFile(), ".mod")+".sum")); err != nil {
				t.Errorf("%s: %v", m.Minor, err)
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "k8s", "*", "go.mod"))
	for _, d := range dirs {
		minor := filepath.Base(filepath.Dir(d))
		found := false
		for _, m := range ms {
			found = found || (m.Minor == minor && !m.Base)
		}
		if !found {
			t.Errorf("k8s/%s/go.mod: no such minor in k8s/versions.txt (or it is the base, which go.mod builds)", minor)
		}
	}

	next := func(minor string) string {
		var maj, min int
		fmt.Sscanf(minor, "%d.%d", &maj, &min)
		return fmt.Sprintf("%d.%d", maj, min+1)
	}
	chart, err := os.ReadFile(filepath.Join(root, "manifests/charts/dynamig/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	wantRange := fmt.Sprintf("kubeVersion: \">=%s.0-0 <%s.0-0\"", supported[0], next(supported[len(supported)-1]))
	if !bytes.Contains(chart, []byte(wantRange)) {
		t.Errorf("Chart.yaml: want %s, the supported minors %v", wantRange, supported)
	}

	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		row := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(m.Minor) + ` \|.*\| ` + string(m.Status) + ` \|$`)
		line := row.Find(readme)
		if line == nil {
			t.Errorf("README.md: no support table row for %s marked %s", m.Minor, m.Status)
			continue
		}
		if !bytes.Contains(line, []byte(m.Release)) {
			t.Errorf("README.md: the %s row does not name %s: %s", m.Minor, m.Release, line)
		}
	}
}

func readModFile(t *testing.T, name string) *modfile.File {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(name, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// newestGoLine is the newest go line ("1.26") of the supported minors' module files: the Go the
// images build with.
func newestGoLine(t *testing.T) string {
	t.Helper()
	ms, err := k8s.Matrix()
	if err != nil {
		t.Fatal(err)
	}
	newest := "go1.0"
	for _, m := range ms {
		if m.Status != k8s.Supported {
			continue
		}
		if v := "go" + readModFile(t, m.ModFile()).Go.Version; goversion.Compare(v, newest) > 0 {
			newest = v
		}
	}
	return strings.TrimPrefix(goversion.Lang(newest), "go")
}
