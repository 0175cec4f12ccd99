// Package images builds dynamig's images without a daemon or a registry: OCI images of the
// binaries `make build` makes, on a base made here from nothing (no pull), written as OCI
// image-layout archives that `ctr images import` and `podman load` take. The Dockerfiles
// (images/*/Dockerfile) build the same images where a daemon runs; test/repo checks that the
// two agree on entrypoint and user.
//
// The scheduler and the webhook are static (no cgo), as in the Dockerfiles, on distroless
// static's layout: /etc/passwd and /etc/group with root and nonroot (65532), /tmp, the user
// 65532. The device plugin links glibc (go-nvml loads libnvidia-ml.so.1 with dlopen): instead
// of distroless base's glibc, the image carries the build host's, the exact libraries the
// binary's ELF header names (its interpreter and DT_NEEDED, recursively), at their paths.
package images

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Spec is one image.
type Spec struct {
	// Name is the binary's and the image's name: dynamig-scheduler.
	Name string
	// Binary is the built binary's path; it is installed at /usr/local/bin/<Name>.
	Binary string
	// Args are the entrypoint's arguments after the binary (the workload probe's image
	// has none; pause is the probe with "pause").
	Args []string
	// User is the image's user, "65532:65532" for nonroot; "" runs as root.
	User string
	// Labels are the image's labels (version, revision).
	Labels map[string]string
}

// NonRoot is distroless's nonroot user.
const NonRoot = "65532:65532"

// Path is where the binary lives in the image.
func (s Spec) Path() string { return "/usr/local/bin/" + s.Name }

// epoch is every file's time, so that the same binary gives the same image.
var epoch = time.Unix(0, 0)

// Build makes the image of s for linux/amd64.
func Build(s Spec) (v1.Image, error) {
	if s.Name == "" || s.Binary == "" {
		return nil, errors.New("images: a spec needs a name and a binary")
	}
	libs, err := Libraries(s.Binary)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Binary, err)
	}
	base, err := layer(baseFiles())
	if err != nil {
		return nil, err
	}
	files := []file{{name: s.Path(), from: s.Binary, mode: 0o755}}
	for _, l := range libs {
		files = append(files, file{name: l, from: l, mode: 0o755})
	}
	bin, err := layer(files)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, base, bin)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = append([]string{s.Path()}, s.Args...)
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.Config.User = s.User
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = s.Labels
	return mutate.ConfigFile(img, cfg)
}

// WriteArchive writes img as an OCI image-layout archive at file, named ref (the
// io.containerd.image.name and org.opencontainers.image.ref.name annotations: what
// `ctr images import` tags it as).
func WriteArchive(file, ref string, img v1.Image) error {
	dir, err := os.MkdirTemp(filepath.Dir(file), ".layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{Architecture: "amd64", OS: "linux"}),
		layout.WithAnnotations(map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref})); err != nil {
		return err
	}
	return tarDir(dir, file)
}

// Libraries lists the shared libraries a dynamically linked ELF binary needs, as absolute
// paths on this host: its interpreter and every DT_NEEDED library, recursively, found where
// the dynamic linker looks on Debian's amd64. None for a static binary.
func Libraries(binary string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	var walk func(file string, root bool) error
	walk = func(file string, root bool) error {
		f, err := elf.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		if root {
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					b, err := io.ReadAll(p.Open())
					if err != nil {
						return err
					}
					interp := string(bytes.TrimRight(b, "\x00"))
					if !seen[interp] {
						seen[interp] = true
						out = append(out, interp)
					}
				}
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return err
		}
		for _, n := range needed {
			lib, err := findLibrary(n)
			if err != nil {
				return fmt.Errorf("%s needs %s: %w", file, n, err)
			}
			if seen[lib] {
				continue
			}
			seen[lib] = true
			out = append(out, lib)
			if err := walk(lib, false); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(binary, true); err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

// libraryDirs are where Debian's dynamic linker finds amd64 libraries.
var libraryDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

func findLibrary(name string) (string, error) {
	for _, d := range libraryDirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %v", libraryDirs)
}

// file is one entry of a layer: a regular file copied from the host (from, symlinks followed),
// one with content, or a directory (name ending in /).
type file struct {
	name    string
	from    string
	content string
	mode    int64
}

// baseFiles is distroless static's skeleton: the users root and nonroot, /tmp and nonroot's
// home.
func baseFiles() []file {
	return []file{
		{name: "/etc/", mode: 0o755},
		{name: "/etc/passwd", mode: 0o644, content: "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
		{name: "/etc/group", mode: 0o644, content: "root:x:0:\nnonroot:x:65532:\n"},
		{name: "/home/", mode: 0o755},
		{name: "/home/nonroot/", mode: 0o700},
		{name: "/root/", mode: 0o700},
		{name: "/tmp/", mode: 0o1777},
		{name: "/usr/", mode: 0o755},
		{name: "/usr/local/", mode: 0o755},
		{name: "/usr/local/bin/", mode: 0o755},
	}
}

// layer writes files, with their parent directories, as one uncompressed tar layer.
func layer(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var mkdirs func(dir string) error
	mkdirs = func(dir string) error {
		if dir == "/" || dir == "." || dirs[dir] {
			return nil
		}
		if err := mkdirs(path.Dir(dir)); err != nil {
			return err
		}
		dirs[dir] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir[1:] + "/", Mode: 0o755, ModTime: epoch})
	}
	for _, f := range files {
		name := path.Clean(f.name)
		if err := mkdirs(path.Dir(name)); err != nil {
			return nil, err
		}
		h := &tar.Header{Name: name[1:], Mode: f.mode, ModTime: epoch}
		uid, gid := 0, 0
		if name == "/home/nonroot" {
			uid, gid = 65532, 65532
		}
		h.Uid, h.Gid = uid, gid
		var body []byte
		switch {
		case f.name[len(f.name)-1] == '/':
			if dirs[name] {
				continue
			}
			dirs[name] = true
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.from != "":
			b, err := os.ReadFile(f.from)
			if err != nil {
				return nil, err
			}
			body = b
			h.Typeflag, h.Size = tar.TypeReg, int64(len(b))
		default:
			body = []byte(f.content)
			h.Typeflag, h.Size = tar.TypeReg, int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// tarDir archives dir's tree (an OCI layout) at file.
func tarDir(dir, file string) error {
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name, h.ModTime = filepath.ToSlash(rel), epoch
		if info.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
