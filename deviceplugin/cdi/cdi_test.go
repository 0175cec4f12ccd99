package cdi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

func TestNames(t *testing.T) {
	for _, tc := range []struct{ node, id, want string }{
		{"mig-node", "GPU-1e4b6a9d::3", "dynamig.io/gpu=mig-node_GPU-1e4b6a9d::3"},
		{"node.example.com", "GPU-1::0", "dynamig.io/gpu=node.example.com_GPU-1::0"},
		{"n", "weird/id with space", "dynamig.io/gpu=n_weird-id-with-space"},
	} {
		got := QualifiedName(tc.node, tc.id)
		if got != tc.want {
			t.Errorf("QualifiedName(%q, %q) = %q, want %q", tc.node, tc.id, got, tc.want)
		}
		if _, _, _, err := parser.ParseQualifiedName(got); err != nil {
			t.Errorf("%q is not a valid CDI name: %v", got, err)
		}
	}
}

// resolve is what a runtime does with the names: a fresh CDI cache of the directory.
func resolve(t *testing.T, dir string, names ...string) (map[string]string, error) {
	t.Helper()
	c, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if _, err := c.InjectDevices(spec, names...); err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env, nil
}

func TestWriteResolveRemove(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	name := QualifiedName("n", "GPU-1::0")
	if _, err := resolve(t, dir, name); err == nil {
		t.Fatal("resolved before any spec was written")
	}
	if err := s.Write("n", "GPU-1::0", specs.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=MIG-a"}}); err != nil {
		t.Fatal(err)
	}
	if env, err := resolve(t, dir, name); err != nil || env["NVIDIA_VISIBLE_DEVICES"] != "MIG-a" {
		t.Fatalf("after the write: %v, %v", env, err)
	}
	// The next pod on the same device ID: the spec is replaced, not duplicated.
	if err := s.Write("n", "GPU-1::0", specs.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=MIG-b"}}); err != nil {
		t.Fatal(err)
	}
	if env, err := resolve(t, dir, name); err != nil || env["NVIDIA_VISIBLE_DEVICES"] != "MIG-b" {
		t.Fatalf("after the rewrite: %v, %v", env, err)
	}
	files, _ := os.ReadDir(dir)
	if len(files) != 1 {
		t.Errorf("files %v, want one spec and no temporary file", files)
	}
	// Another device resolves on its own spec.
	if err := s.Write("n", "GPU-1::1", specs.ContainerEdits{Env: []string{"SECOND=MIG-c"}}); err != nil {
		t.Fatal(err)
	}
	if env, err := resolve(t, dir, name, QualifiedName("n", "GPU-1::1")); err != nil || env["NVIDIA_VISIBLE_DEVICES"] != "MIG-b" || env["SECOND"] != "MIG-c" {
		t.Fatalf("two devices: %v, %v", env, err)
	}
	if err := s.Remove("n", "GPU-1::0"); err != nil {
		t.Fatal(err)
	}
	if _, err := resolve(t, dir, name); err == nil {
		t.Error("resolved after the spec was removed")
	}
	if err := s.Remove("n", "GPU-1::0"); err != nil {
		t.Errorf("removing a missing spec: %v", err)
	}
}

func TestWriteRefusesBadEdits(t *testing.T) {
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	err = s.Write("n", "GPU-1::0", specs.ContainerEdits{Env: []string{"=no-name"}})
	if err == nil || !strings.Contains(err.Error(), "n_GPU-1::0") {
		t.Errorf("got %v", err)
	}
}

// TestEditsFromAnAllocateAnswer: a hami-core answer (environment and mounts) becomes the
// spec's edits, and a container naming the device gets them.
func TestEditsFromAnAllocateAnswer(t *testing.T) {
	host := t.TempDir()
	for _, f := range []string{"libvgpu.so", "ld.so.preload"} {
		if err := os.WriteFile(filepath.Join(host, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	resp := &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1", "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_SM_LIMIT": "30"},
		Mounts: []*pluginapi.Mount{
			{ContainerPath: "/usr/local/vgpu/libvgpu.so", HostPath: filepath.Join(host, "libvgpu.so"), ReadOnly: true},
			{ContainerPath: "/tmp/vgpu", HostPath: host},
		},
	}
	e := Edits(resp)
	if strings.Join(e.Env, " ") != "CUDA_DEVICE_MEMORY_LIMIT_0=3000m CUDA_DEVICE_SM_LIMIT=30 NVIDIA_VISIBLE_DEVICES=GPU-1" {
		t.Errorf("env %v", e.Env)
	}
	if len(e.Mounts) != 2 || e.Mounts[0].Options[1] != "ro" || e.Mounts[1].Options[1] != "rw" {
		t.Errorf("mounts %+v %+v", e.Mounts[0], e.Mounts[1])
	}
	dir := filepath.Join(t.TempDir(), "cdi")
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write("core-node", "GPU-1::4", e); err != nil {
		t.Fatal(err)
	}
	env, err := resolve(t, dir, QualifiedName("core-node", "GPU-1::4"))
	if err != nil || env["CUDA_DEVICE_SM_LIMIT"] != "30" || env["NVIDIA_VISIBLE_DEVICES"] != "GPU-1" {
		t.Errorf("resolved %v, %v", env, err)
	}
}
