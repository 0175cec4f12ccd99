// Command modfiles writes the module file of every Kubernetes minor of k8s/versions.txt but the
// base (go.mod builds that one): k8s/<minor>/go.mod and go.sum, go.mod with k8s.io/kubernetes and
// each of that release's staging modules pinned to it, the modules the minor's line pins, then
// `go mod tidy`. Before the others, it raises every module of go.mod outside k8s.io to the newest
// supported minor's version (but those the base pins), so that all supported minors build one
// set of them and a cold `make test` compiles each once. Run from the repository root
// (`make modfiles`); test/repo's TestKubernetesMatrix fails when a module file disagrees.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	goversion "go/version"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"

	"github.com/dynamig/dynamig/k8s"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "modfiles:", err)
		os.Exit(1)
	}
}

func run() error {
	ms, err := k8s.Matrix()
	if err != nil {
		return err
	}
	newest := k8s.Newest(ms)
	for _, m := range ms {
		if m.Base {
			if err := align(m, newest); err != nil {
				return err
			}
		}
	}
	base, err := os.ReadFile("go.mod")
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.Base || m.Minor == newest.Minor && !newest.Base {
			continue // align wrote the newest's from this go.mod in its last round
		}
		fmt.Fprintf(os.Stderr, "modfiles: %s (%s)\n", m.ModFile(), m.Release)
		if err := write(base, m); err != nil {
			return fmt.Errorf("%s: %w", m.Minor, err)
		}
	}
	return nil
}

// align raises go.mod's modules outside k8s.io to the versions the newest minor's module file,
// derived from go.mod, has, sets the base's pins and tidies, until go.mod has nothing to raise
// (a raised module can bring a new one in).
func align(base, newest k8s.Minor) error {
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		return err
	}
	if got := requireOf(gomod, "k8s.io/kubernetes"); got != base.Release {
		return fmt.Errorf("go.mod builds k8s.io/kubernetes %s, but k8s/versions.txt's base is %s", got, base.Release)
	}
	if newest.Base {
		return nil
	}
	for round := 1; ; round++ {
		fmt.Fprintf(os.Stderr, "modfiles: go.mod at %s's modules outside k8s.io (round %d)\n", newest.Minor, round)
		if err := write(gomod, newest); err != nil {
			return fmt.Errorf("%s: %w", newest.Minor, err)
		}
		data, err := os.ReadFile(newest.ModFile())
		if err != nil {
			return err
		}
		nf, err := modfile.Parse(newest.ModFile(), data, nil)
		if err != nil {
			return err
		}
		f, err := modfile.Parse("go.mod", gomod, nil)
		if err != nil {
			return err
		}
		pinned := map[string]bool{}
		for _, p := range base.Pins {
			pinned[p.Path] = true
		}
		changed := false
		for _, r := range f.Require {
			if strings.HasPrefix(r.Mod.Path, "k8s.io/") || pinned[r.Mod.Path] {
				continue
			}
			if v := requireOf(data, r.Mod.Path); v != "" && v != r.Mod.Version {
				if err := f.AddRequire(r.Mod.Path, v); err != nil {
					return err
				}
				changed = true
			}
		}
		if goversion.Compare("go"+nf.Go.Version, "go"+f.Go.Version) > 0 && goversion.Compare("go"+nf.Go.Version, runtime.Version()) <= 0 {
			if err := f.AddGoStmt(nf.Go.Version); err != nil {
				return err
			}
		}
		for _, p := range base.Pins {
			if requireOf(gomod, p.Path) != p.Version {
				if err := f.AddRequire(p.Path, p.Version); err != nil {
					return err
				}
				changed = true
			}
		}
		if !changed {
			return checkPins(gomod, base)
		}
		f.Cleanup()
		out, err := f.Format()
		if err != nil {
			return err
		}
		if err := os.WriteFile("go.mod", out, 0o644); err != nil {
			return err
		}
		if err := goCmd(nil, "local", "mod", "tidy"); err != nil {
			return err
		}
		if gomod, err = os.ReadFile("go.mod"); err != nil {
			return err
		}
		if round == 5 {
			return fmt.Errorf("go.mod still changes after %d rounds of raising it to %s's modules", round, newest.Minor)
		}
	}
}

// checkPins fails when tidy raised a pinned module past its pin: another module of the file
// requires more, and needs pinning too.
func checkPins(gomod []byte, m k8s.Minor) error {
	for _, p := range m.Pins {
		if got := requireOf(gomod, p.Path); got != p.Version {
			return fmt.Errorf("%s pins %s@%s, but its module file has %s: a module it requires needs that version; pin that one too (k8s/versions.txt)", m.Minor, p.Path, p.Version, got)
		}
	}
	return nil
}

func requireOf(gomod []byte, path string) string {
	f, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		return ""
	}
	for _, r := range f.Require {
		if r.Mod.Path == path {
			return r.Mod.Version
		}
	}
	return ""
}

// write derives m's module file from the base go.mod and tidies it.
func write(base []byte, m k8s.Minor) error {
	staging, goVersion, err := kubernetesModule(m.Release)
	if err != nil {
		return err
	}
	f, err := modfile.Parse("go.mod", base, nil)
	if err != nil {
		return err
	}
	if goversion.Compare("go"+goVersion, "go"+f.Go.Version) > 0 {
		// Said here, so that go switches to that toolchain before it loads the module graph.
		if err := f.AddGoStmt(goVersion); err != nil {
			return err
		}
	}
	if err := f.AddRequire("k8s.io/kubernetes", m.Release); err != nil {
		return err
	}
	for _, r := range f.Require {
		if staging[r.Mod.Path] && r.Mod.Version != "v0.0.0" {
			if err := f.AddRequire(r.Mod.Path, m.Staging()); err != nil {
				return err
			}
		}
	}
	for _, r := range f.Replace {
		if strings.HasPrefix(r.Old.Path, "k8s.io/") && !staging[r.Old.Path] {
			if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	// In place where go.mod has the line, appended in order where it has none.
	for _, p := range slices.Sorted(maps.Keys(staging)) {
		if err := f.AddReplace(p, "", p, m.Staging()); err != nil {
			return err
		}
	}
	for _, p := range m.Pins {
		if err := f.AddRequire(p.Path, p.Version); err != nil {
			return err
		}
	}
	f.Cleanup()
	f.SortBlocks()
	out, err := f.Format()
	if err != nil {
		return err
	}
	out = append([]byte(fmt.Sprintf("// Kubernetes %s (%s): generated from go.mod and k8s/versions.txt by `make modfiles`; do not edit.\n", m.Minor, m.Release)), out...)
	file, err := filepath.Abs(m.ModFile())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(file, out, 0o644); err != nil {
		return err
	}
	sum := strings.TrimSuffix(file, ".mod") + ".sum"
	if _, err := os.Stat(sum); os.IsNotExist(err) {
		// A start for tidy: the base's sums, most of which the minor shares.
		if b, err := os.ReadFile("go.sum"); err == nil {
			if err := os.WriteFile(sum, b, 0o644); err != nil {
				return err
			}
		}
	}
	// A release may need a newer Go than this one: go fetches that toolchain (its module file's
	// go line, which go reads only from go.mod, not from -modfile). A preview
	// release may import what the module proxy does not serve yet (1.38.0-beta.0's kubelet):
	// its packages that need it are left unbuildable, the rest is tidied.
	args := []string{"mod", "tidy", "-modfile=" + file}
	if m.Status == k8s.Preview {
		args = append(args, "-e")
	}
	if err := goCmd(nil, toolchain(f.Go.Version), args...); err != nil {
		return err
	}
	tidied, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	return checkPins(tidied, m)
}

// toolchain is the GOTOOLCHAIN that builds a module file whose go line is goLine: this Go, or
// that release where it is newer (the Makefile decides the same for GOTOOLCHAIN).
func toolchain(goLine string) string {
	if goversion.Compare("go"+goLine, goversion.Lang(runtime.Version())) > 0 && goversion.Compare("go"+goLine, runtime.Version()) > 0 {
		return "go" + goLine
	}
	return "local"
}

// kubernetesModule says which modules k8s.io/kubernetes at release builds from its staging tree,
// and the Go version it needs.
func kubernetesModule(release string) (staging map[string]bool, goVersion string, err error) {
	var out bytes.Buffer
	if err := goCmd(&out, "auto", "mod", "download", "-json", "k8s.io/kubernetes@"+release); err != nil {
		return nil, "", err
	}
	var dl struct{ GoMod, Error string }
	if err := json.Unmarshal(out.Bytes(), &dl); err != nil {
		return nil, "", err
	}
	if dl.Error != "" {
		return nil, "", fmt.Errorf("k8s.io/kubernetes@%s: %s", release, dl.Error)
	}
	data, err := os.ReadFile(dl.GoMod)
	if err != nil {
		return nil, "", err
	}
	f, err := modfile.Parse(dl.GoMod, data, nil)
	if err != nil {
		return nil, "", err
	}
	staging = map[string]bool{}
	for _, r := range f.Replace {
		if strings.HasPrefix(r.New.Path, "./staging/") {
			staging[r.Old.Path] = true
		}
	}
	if len(staging) == 0 {
		return nil, "", fmt.Errorf("k8s.io/kubernetes@%s names no staging module", release)
	}
	return staging, f.Go.Version, nil
}

func goCmd(stdout *bytes.Buffer, toolchain string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN="+toolchain, "GOFLAGS=")
	cmd.Stderr = os.Stderr
	if stdout != nil {
		cmd.Stdout = stdout
	} else {
		cmd.Stdout = os.Stderr
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return nil
}
