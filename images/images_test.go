package images

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// build builds the command pkg (relative to the repository root) into dir as the tests' own
// packages are built (with cgo, as make test builds everything: a static build would compile
// every package again), so a binary the image ships static here links glibc, which the image
// then carries: the same path as the device plugin's.
func build(t *testing.T, dir, name, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-ldflags=-w", "-o", out, pkg)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

func TestLibraries(t *testing.T) {
	static := build(t, t.TempDir(), "probe", "./test/probe")
	if libs, err := Libraries(static); err != nil || len(libs) != 0 {
		t.Errorf("a static binary: %v, %v", libs, err)
	}
	libs, err := Libraries("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(libs, func(l string) bool { return filepath.Base(l) == "libc.so.6" }) ||
		!slices.ContainsFunc(libs, func(l string) bool { return strings.HasPrefix(filepath.Base(l), "ld-linux") }) {
		t.Errorf("/bin/sh needs its interpreter and libc, got %v", libs)
	}
}

// TestShippedImages builds the three images from freshly built binaries and checks what
// each holds: the entrypoint and user its Dockerfile names, the base's users and /tmp, and —
// run in a chroot of the image's filesystem, where the host has root — that the binary starts
// with only what the image carries (the device plugin's glibc included).
func TestShippedImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the three binaries")
	}
	bin := t.TempDir()
	for _, name := range []string{"dynamig-scheduler", "dynamig-webhook", "dynamig-device-plugin"} {
		build(t, bin, name, "./cmd/"+name)
	}
	for _, s := range Shipped(bin, "v0.0.0-test", "abc") {
		t.Run(s.Name, func(t *testing.T) {
			img, err := Build(s)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			dockerfile, err := os.ReadFile(filepath.Join(s.Name, "Dockerfile"))
			if err != nil {
				t.Fatal(err)
			}
			wantUser := ""
			if m := regexp.MustCompile(`(?m)^USER (\S+)$`).FindSubmatch(dockerfile); m != nil {
				wantUser = string(m[1])
			}
			if cfg.Config.User != wantUser {
				t.Errorf("user %q, the Dockerfile's %q", cfg.Config.User, wantUser)
			}
			wantEntry := `ENTRYPOINT ["` + s.Path() + `"]`
			if !bytes.Contains(dockerfile, []byte(wantEntry)) || !slices.Equal(cfg.Config.Entrypoint, []string{s.Path()}) {
				t.Errorf("entrypoint %q; the Dockerfile should say %s", cfg.Config.Entrypoint, wantEntry)
			}
			if cfg.OS != "linux" || cfg.Architecture != "amd64" || cfg.Config.Labels["org.opencontainers.image.version"] != "v0.0.0-test" {
				t.Errorf("platform %s/%s, labels %v", cfg.OS, cfg.Architecture, cfg.Config.Labels)
			}

			root := t.TempDir()
			files := extract(t, img, root)
			libs, err := Libraries(s.Binary)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range append([]string{"etc/passwd", "etc/group", "tmp", s.Path()}, libs...) {
				if !slices.Contains(files, strings.TrimPrefix(want, "/")) {
					t.Errorf("the image lacks %s", want)
				}
			}
			if os.Geteuid() != 0 {
				t.Log("not root: the binary is not run in the image's filesystem")
				return
			}
			cmd := exec.Command(s.Path(), "--version")
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
			cmd.Dir = "/"
			cmd.Env = cfg.Config.Env
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "v0.0.0") && !strings.Contains(string(out), s.Name) {
				t.Errorf("%s --version in the image: %v\n%s", s.Path(), err, out)
			}
		})
	}
}

// extract unpacks img's filesystem under root and lists its entries.
func extract(t *testing.T, img v1.Image, root string) []string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, strings.TrimSuffix(h.Name, "/"))
		p := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, os.FileMode(h.Mode)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return names
}

// TestWriteArchive: the archive is an OCI image layout whose one image is named by the
// annotations ctr import reads.
func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	img, err := Build(Spec{Name: "probe", Binary: build(t, dir, "probe", "./test/probe"), User: NonRoot})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "probe.tar")
	if err := WriteArchive(file, "dynamig.io/probe:test", img); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "layout")
	if b, err := exec.Command("tar", "-xf", file, "-C", mkdir(t, out)).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, b)
	}
	idx, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations["io.containerd.image.name"] != "dynamig.io/probe:test" ||
		m.Manifests[0].Platform == nil || m.Manifests[0].Platform.OS != "linux" {
		t.Errorf("index %+v", m.Manifests)
	}
}

func mkdir(t *testing.T, d string) string {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}
