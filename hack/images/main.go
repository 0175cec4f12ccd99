// Command images builds dynamig's images without a daemon or a registry (package images):
// the binaries as images/*/Dockerfile builds them, then one OCI image-layout archive per image
// under -out, named as `make images` tags them: <registry>/dynamig-scheduler:<version>-k8s<minor>
// for each supported Kubernetes minor, <registry>/dynamig-webhook:<version> and
// <registry>/dynamig-device-plugin:<version> on the newest. `ctr -n k8s.io images import` and
// `podman load` take the archives. hack/images.sh runs it where no image builder is found.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/dynamig/dynamig/images"
	"github.com/dynamig/dynamig/k8s"
)

func main() {
	out := flag.String("out", "bin/images", "directory for the image archives")
	version := flag.String("version", "dev", "the version the binaries are stamped with and the images tagged with")
	commit := flag.String("commit", "unknown", "the commit the binaries are stamped with")
	registry := flag.String("registry", "dynamig", "the images' repository prefix")
	flag.Parse()
	if err := run(*out, *version, *commit, *registry); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(out, version, commit, registry string) error {
	ms, err := k8s.Matrix()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	bin, err := os.MkdirTemp(out, ".bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	newest := k8s.Newest(ms)
	for _, spec := range images.Shipped(bin, version, commit) {
		minors := []k8s.Minor{newest}
		if spec.Name == "dynamig-scheduler" {
			minors = minors[:0]
			for _, m := range ms {
				if m.Status == k8s.Supported {
					minors = append(minors, m)
				}
			}
		}
		for _, m := range minors {
			tag := registry + "/" + spec.Name + ":" + version
			if spec.Name == "dynamig-scheduler" {
				tag += "-k8s" + m.Minor
			}
			if err := goBuild(spec, m, version, commit); err != nil {
				return err
			}
			img, err := images.Build(spec)
			if err != nil {
				return fmt.Errorf("%s: %w", tag, err)
			}
			file := filepath.Join(out, strings.NewReplacer("/", "_", ":", "_").Replace(tag)+".tar")
			if err := images.WriteArchive(file, tag, img); err != nil {
				return fmt.Errorf("%s: %w", tag, err)
			}
			fmt.Printf("images: %s (Kubernetes %s) -> %s\n", tag, m.Minor, file)
		}
	}
	return nil
}

// goBuild builds spec's binary on minor m's module file, as its Dockerfile does.
func goBuild(spec images.Spec, m k8s.Minor, version, commit string) error {
	modfile, err := filepath.Abs(m.ModFile())
	if err != nil {
		return err
	}
	ldflags := "-s -w -X github.com/dynamig/dynamig/version.version=" + version + " -X github.com/dynamig/dynamig/version.commit=" + commit
	cmd := exec.Command("go", "build", "-modfile="+modfile, "-trimpath", "-ldflags", ldflags, "-o", spec.Binary, "./cmd/"+spec.Name)
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations", "CGO_ENABLED=1")
	if images.Static(spec.Name) {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s on Kubernetes %s: %w", spec.Name, m.Minor, err)
	}
	return nil
}
