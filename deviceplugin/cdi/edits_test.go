package cdi

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

func TestEnvOnly(t *testing.T) {
	for _, tc := range []struct {
		uuids []string
		want  string
	}{
		{[]string{"MIG-a"}, "NVIDIA_VISIBLE_DEVICES=MIG-a"},
		{[]string{"MIG-a", "MIG-b"}, "NVIDIA_VISIBLE_DEVICES=MIG-a,MIG-b"},
		{[]string{"GPU-1"}, "NVIDIA_VISIBLE_DEVICES=GPU-1"},
	} {
		e, err := EnvOnly{}.Edits(tc.uuids)
		if err != nil || !reflect.DeepEqual(e, specs.ContainerEdits{Env: []string{tc.want}}) {
			t.Errorf("EnvOnly(%v) = %+v, %v; want only %s", tc.uuids, e, err, tc.want)
		}
	}
}

// What nvcdi answers for a MIG device on an A100 (GPU 0, GI 3, CI 0) and the common edits,
// in the shape of its specs.
func migDevice(name, gpu, gi, ci string) specs.Device {
	return specs.Device{Name: name, ContainerEdits: specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{
		node("/dev/nvidia" + gpu), node("/dev/nvidia-caps/nvidia-cap" + gi), node("/dev/nvidia-caps/nvidia-cap" + ci),
	}}}
}

// node is a character device the runtime need not stat (this machine has none).
func node(path string) *specs.DeviceNode {
	return &specs.DeviceNode{Path: path, HostPath: path, Type: "c", Major: 195}
}

func commonEdits() specs.ContainerEdits {
	return specs.ContainerEdits{
		Env:         []string{"NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu", "NVIDIA_VISIBLE_DEVICES=void"},
		DeviceNodes: []*specs.DeviceNode{node("/dev/nvidiactl"), node("/dev/nvidia-uvm")},
		Mounts: []*specs.Mount{{HostPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1", ContainerPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1",
			Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}}},
		Hooks: []*specs.Hook{
			{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"}},
			{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"}},
		},
	}
}

func paths(nodes []*specs.DeviceNode) string {
	var p []string
	for _, n := range nodes {
		p = append(p, n.Path)
	}
	return strings.Join(p, " ")
}

func TestMergeDeviceSpecs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		uuids   []string
		devices []specs.Device
		env     string
		nodes   string
		err     string
	}{
		{
			name:    "one MIG device",
			uuids:   []string{"MIG-a"},
			devices: []specs.Device{migDevice("0:0", "0", "30", "31")},
			env:     "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu NVIDIA_VISIBLE_DEVICES=MIG-a",
			nodes:   "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia0 /dev/nvidia-caps/nvidia-cap30 /dev/nvidia-caps/nvidia-cap31",
		},
		{
			// Two instances of one GPU share /dev/nvidia0: the node is given once.
			name:    "two MIG devices of one GPU",
			uuids:   []string{"MIG-a", "MIG-b"},
			devices: []specs.Device{migDevice("0:0", "0", "30", "31"), migDevice("0:1", "0", "39", "40")},
			env:     "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu NVIDIA_VISIBLE_DEVICES=MIG-a,MIG-b",
			nodes:   "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia0 /dev/nvidia-caps/nvidia-cap30 /dev/nvidia-caps/nvidia-cap31 /dev/nvidia-caps/nvidia-cap39 /dev/nvidia-caps/nvidia-cap40",
		},
		{
			name:    "a full GPU",
			uuids:   []string{"GPU-1"},
			devices: []specs.Device{{Name: "1", ContainerEdits: specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{node("/dev/nvidia1")}}}},
			env:     "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu NVIDIA_VISIBLE_DEVICES=GPU-1",
			nodes:   "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia1",
		},
		{name: "no spec", uuids: []string{"MIG-a"}, err: "no CDI device spec for MIG-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			common := commonEdits()
			e, err := MergeDeviceSpecs(tc.uuids, common, tc.devices)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(e.Env, " "); got != tc.env {
				t.Errorf("env %q, want %q", got, tc.env)
			}
			if got := paths(e.DeviceNodes); got != tc.nodes {
				t.Errorf("device nodes %q, want %q", got, tc.nodes)
			}
			if len(e.Mounts) != 1 || len(e.Hooks) != 2 {
				t.Errorf("mounts %d hooks %d, want the common 1 and 2", len(e.Mounts), len(e.Hooks))
			}
			if !reflect.DeepEqual(common, commonEdits()) {
				t.Error("the cached common edits were changed")
			}
			// A runtime accepts the spec: written and resolved through the CDI library.
			dir := filepath.Join(t.TempDir(), "cdi")
			s, err := New(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Write("n", "GPU-1::0", e); err != nil {
				t.Fatal(err)
			}
			env, err := resolve(t, dir, QualifiedName("n", "GPU-1::0"))
			if err != nil || env[VisibleDevicesEnv] != strings.Join(tc.uuids, ",") {
				t.Errorf("resolved %v, %v", env, err)
			}
		})
	}
}

// TestMerge: HAMi-core's answer merged over what the device gets: its variables win, each
// variable, node, mount and hook once.
func TestMerge(t *testing.T) {
	timeout := 5
	hook := func() *specs.Hook {
		return &specs.Hook{HookName: "createContainer", Path: "/h", Args: []string{"h", "x"}, Timeout: &timeout}
	}
	device := specs.ContainerEdits{
		Env:            []string{"NVIDIA_VISIBLE_DEVICES=GPU-1", "A=1"},
		DeviceNodes:    []*specs.DeviceNode{{Path: "/dev/nvidia0"}},
		Mounts:         []*specs.Mount{{HostPath: "/lib/a", ContainerPath: "/lib/a", Options: []string{"ro"}}},
		Hooks:          []*specs.Hook{hook()},
		AdditionalGIDs: []uint32{44},
	}
	hami := specs.ContainerEdits{
		Env:            []string{"CUDA_DEVICE_SM_LIMIT=30", "NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2"},
		DeviceNodes:    []*specs.DeviceNode{{Path: "/dev/nvidia0", Permissions: "rw"}},
		Mounts:         []*specs.Mount{{HostPath: "/vgpu/lib/a", ContainerPath: "/lib/a", Options: []string{"ro"}}, {HostPath: "/vgpu", ContainerPath: "/usr/local/vgpu"}},
		Hooks:          []*specs.Hook{hook(), {HookName: "createContainer", Path: "/h", Args: []string{"h", "y"}}},
		AdditionalGIDs: []uint32{44, 45},
	}
	e := Merge(device, hami)
	if got := strings.Join(e.Env, " "); got != "NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2 A=1 CUDA_DEVICE_SM_LIMIT=30" {
		t.Errorf("env %q", got)
	}
	if len(e.DeviceNodes) != 1 || e.DeviceNodes[0].Permissions != "rw" {
		t.Errorf("device nodes %+v", e.DeviceNodes)
	}
	if len(e.Mounts) != 2 || e.Mounts[0].HostPath != "/vgpu/lib/a" || e.Mounts[1].ContainerPath != "/usr/local/vgpu" {
		t.Errorf("mounts %+v %+v", e.Mounts[0], e.Mounts[1])
	}
	if len(e.Hooks) != 2 || e.Hooks[1].Args[1] != "y" {
		t.Errorf("hooks %+v", e.Hooks)
	}
	if !reflect.DeepEqual(e.AdditionalGIDs, []uint32{44, 45}) {
		t.Errorf("groups %v", e.AdditionalGIDs)
	}
	if !reflect.DeepEqual(Merge(), specs.ContainerEdits{}) {
		t.Errorf("nothing merged: %+v", Merge())
	}
}

// TestNewNVCDIWithoutDriver: with no driver (no libnvidia-ml.so.1 under the driver root, none
// on this machine), the constructor says NVML cannot be initialised.
func TestNewNVCDIWithoutDriver(t *testing.T) {
	root := t.TempDir()
	_, err := NewNVCDI(NVCDIOptions{DriverRoot: root, DevRoot: root, Logger: klog.Background()})
	if err == nil {
		t.Skip("NVML initialises here: a machine with an NVIDIA driver")
	}
	if !strings.Contains(err.Error(), "NVML") || !strings.Contains(err.Error(), root) {
		t.Errorf("err %v, want one naming NVML and the driver root", err)
	}
}
