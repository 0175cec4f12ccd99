// Package runtimetools builds the real container runtime test nodes run on (test/kubeletnode's
// nodes on containerd): containerd 2.x, its runc shim, ctr, runc, the CNI plugins, containerd
// 1.7 for a node with CDI off, and this repository's cnistub and noseccomp, each from its own
// module, once, into the user's cache directory (test/usercache).
package runtimetools

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dynamig/dynamig/test/usercache"
)

// Env names a directory holding the runtime's binaries (Dir), built already:
// test/realcluster's TestMain sets it for the suite it runs in its own network namespace,
// where the go command cannot download modules.
const Env = "DYNAMIG_RUNTIME_TOOLS"

// installs are the runtime's programs by module: each module's built by one `go install`
// of them all at their version (in its own module graph, not this repository's), so the go
// command links them side by side.
var installs = [][]string{
	{"github.com/containerd/containerd/v2/cmd/containerd@v2.4.2",
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v2.4.2",
		"github.com/containerd/containerd/v2/cmd/ctr@v2.4.2"},
	{"github.com/opencontainers/runc@v1.5.3"},
	{"github.com/containernetworking/plugins/plugins/main/loopback@v1.9.1",
		"github.com/containernetworking/plugins/plugins/main/ptp@v1.9.1",
		"github.com/containernetworking/plugins/plugins/ipam/host-local@v1.9.1"},
}

// containerd17 is containerd 1.7, the last whose CRI plugin can turn CDI off (enable_cdi;
// 2.x always applies CDI): the runtime of a node with CDI off. Its module has exclude
// directives, which `go install pkg@version` refuses, so it is built as the main module in its
// directory of the module cache (its own go.sum, nothing written there), without cgo.
const containerd17 = "github.com/containerd/containerd@v1.7.35"

// noInlining compiles the runtime's programs without inlining, as make test compiles: they
// only serve tests, and the compile takes about 15 % less CPU (the Makefile's test target).
const noInlining = "-gcflags=all=-l"

// containerd17Flags build containerd17 as its release is built (its version stamped: the CRI
// reports it, and the device plugin reads it), without the snapshotters and tracing nothing
// here uses.
var containerd17Flags = []string{"-mod=readonly", "-trimpath", noInlining, "-tags=no_aufs,no_btrfs,no_devmapper,no_zfs,no_tracing",
	"-ldflags=-s -w -X github.com/containerd/containerd/version.Version=" + strings.Split(containerd17, "@")[1]}

// Containerd17Dir is the directory in Dir's holding containerd17's containerd and its runc
// shim (2.x's shim refuses 1.7's start-up protocol), first on its PATH.
const Containerd17Dir = "containerd-1.7"

// names are the binaries Dir's directory holds.
var names = []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "loopback", "ptp", "host-local", "cnistub", "noseccomp", Containerd17Dir + "/containerd", Containerd17Dir + "/containerd-shim-runc-v2"}

// ourTools are the programs of this module among them.
var ourTools = []string{"cnistub", "noseccomp"}

// Dir returns a directory holding containerd, its runc shim, ctr, runc, the CNI loopback,
// ptp and host-local plugins, cnistub and noseccomp, and containerd 1.7 with its shim in
// Containerd17Dir: $DYNAMIG_RUNTIME_TOOLS, or one built once per process into the user's cache
// directory (<cache>/dynamig/tools-<hash of the versions and flags>), kept and reused.
// containerd's cold build is about 75 s, 1.7's about 120 s.
func Dir() (string, error) { return build.Get() }

var build = &usercache.Build{Env: Env, What: "the real runtime",
	Name: func() (string, error) {
		var spec []string
		for _, pkgs := range installs {
			for _, pkg := range pkgs {
				spec = append(spec, pkg+" "+ldFlags(pkg))
			}
		}
		sum := sha256.Sum256([]byte(strings.Join(slices.Concat(spec, []string{containerd17, noInlining}, containerd17Flags), "\n")))
		return "tools-" + hex.EncodeToString(sum[:6]), nil
	},
	Check: check, Make: Build}

// Build builds what Dir returns into dir: the others' binaries only where dir lacks them,
// cnistub and noseccomp every time (from the build cache) from this module (the go command's
// module file and flags); the others with `go install pkg@version`, without GOFLAGS (a
// -modfile of ours would not apply).
func Build(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	env := append(os.Environ(), "GOBIN="+dir, "GOFLAGS=", "CGO_ENABLED=1")
	for _, pkgs := range installs {
		var missing []string
		for _, pkg := range pkgs {
			if _, err := os.Stat(filepath.Join(dir, path.Base(strings.Split(pkg, "@")[0]))); err != nil {
				missing = append(missing, pkg)
			}
		}
		if len(missing) == 0 {
			continue
		}
		cmd := exec.Command("go", append([]string{"install", noInlining, "-ldflags=" + ldFlags(missing[0])}, missing...)...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go install %s: %w\n%s", strings.Join(missing, " "), err, out)
		}
	}
	if err := buildContainerd17(dir, env); err != nil {
		return err
	}
	for _, name := range ourTools {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), "github.com/dynamig/dynamig/test/kubeletnode/"+name)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", name, err, out)
		}
	}
	return check(dir)
}

// buildContainerd17 builds containerd17's containerd and shim into dir/Containerd17Dir,
// unless there already.
func buildContainerd17(dir string, env []string) error {
	out := filepath.Join(dir, Containerd17Dir)
	if _, err := os.Stat(filepath.Join(out, "containerd-shim-runc-v2")); err == nil {
		return nil
	}
	download := exec.Command("go", "mod", "download", "-json", containerd17)
	download.Env = env
	raw, err := download.Output()
	var mod struct{ Dir, Error string }
	if jerr := json.Unmarshal(raw, &mod); err != nil || jerr != nil || mod.Dir == "" {
		return fmt.Errorf("go mod download %s: %v %v %s", containerd17, err, jerr, mod.Error)
	}
	build := exec.Command("go", append(append([]string{"build"}, containerd17Flags...), "-o", out+"/", "./cmd/containerd", "./cmd/containerd-shim-runc-v2")...)
	build.Dir = mod.Dir
	build.Env = append(env, "CGO_ENABLED=0", "GOWORK=off")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", containerd17, err, b)
	}
	return nil
}

// ldFlags are the linker flags of a runtime program (the same for a module's programs):
// containerd's with its version stamped as its releases have it (the CRI reports it, and the
// device plugin reads it).
func ldFlags(pkg string) string {
	const ctd = "github.com/containerd/containerd/v2/"
	if !strings.HasPrefix(pkg, ctd) {
		return "-s -w"
	}
	return "-s -w -X " + ctd + "version.Version=" + strings.Split(pkg, "@")[1]
}

func check(dir string) error {
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("the real runtime's %s: %w", name, err)
		}
	}
	return nil
}
