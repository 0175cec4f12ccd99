package kubeletnode

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const spec = `cdiVersion: "0.6.0"
kind: dynamig.io/mig
devices:
- name: n-gpu0-slot1
  containerEdits:
    env: ["NVIDIA_VISIBLE_DEVICES=MIG-1234"]
    deviceNodes: [{path: /dev/null}]
`

// TestRuntimeResolvesCDI: CDI names resolve against the spec directory as read at the
// create (a spec written just before counts), the container's environment is recorded, and
// a name without a spec fails the create, as containerd does.
func TestRuntimeResolvesCDI(t *testing.T) {
	dir := t.TempDir()
	rt, err := StartRuntime(filepath.Join(dir, "cri.sock"), filepath.Join(dir, "cdi"), RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Stop()
	ctx := context.Background()
	sandbox := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "default", Uid: "uid-1"}, LogDirectory: "/logs/p"}
	id, err := rt.RuntimeService.RunPodSandbox(ctx, sandbox, "")
	if err != nil {
		t.Fatal(err)
	}
	create := func(name string, devices ...string) error {
		cfg := &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name}, Image: &runtimeapi.ImageSpec{Image: "busybox"}, LogPath: name + "/0.log",
			Envs: []*runtimeapi.KeyValue{envVar("A", "1")}}
		for _, d := range devices {
			cfg.CDIDevices = append(cfg.CDIDevices, &runtimeapi.CDIDevice{Name: d})
		}
		_, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: id, Config: cfg, SandboxConfig: sandbox})
		return err
	}
	if err := create("early", "dynamig.io/mig=n-gpu0-slot1"); err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices dynamig.io/mig=n-gpu0-slot1") {
		t.Errorf("before the spec exists: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "cdi"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cdi", "dynamig.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := create("main", "dynamig.io/mig=n-gpu0-slot1"); err != nil {
		t.Fatal(err)
	}
	c, ok := rt.Latest("uid-1", "main")
	if !ok || c.Env["NVIDIA_VISIBLE_DEVICES"] != "MIG-1234" || c.Env["A"] != "1" || len(c.DeviceNodes) != 1 || c.DeviceNodes[0] != "/dev/null" {
		t.Errorf("resolved container: %+v", c)
	}
	// The kubelet removes "<log path>*" with a container: an empty path would be every file
	// of its working directory.
	if st, err := rt.RuntimeService.ContainerStatus(ctx, c.ID, false); err != nil || st.Status.LogPath != "/logs/p/main/0.log" {
		t.Errorf("log path %q, %v", st.GetStatus().GetLogPath(), err)
	}
	if err := create("other", "dynamig.io/mig=n-gpu0-slot2"); err == nil {
		t.Error("a name without a spec resolved")
	}
	if len(rt.Created()) != 1 {
		t.Errorf("failed creates were recorded: %+v", rt.Created())
	}
}

// TestCheckIsolationSaysWhatIsMissing: without unshare, the error names it.
func TestCheckIsolationSaysWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if err := CheckIsolation(); err == nil || !strings.Contains(err.Error(), "unshare (util-linux), which is not installed") {
		t.Errorf("got %v", err)
	}
}

// envVar is a CRI environment variable; its Value is a string before cri-api 0.36 and bytes
// from it, and this test builds on every minor of the matrix.
func envVar(k, v string) *runtimeapi.KeyValue {
	kv := &runtimeapi.KeyValue{Key: k}
	f := reflect.ValueOf(kv).Elem().FieldByName("Value")
	f.Set(reflect.ValueOf(v).Convert(f.Type()))
	return kv
}
