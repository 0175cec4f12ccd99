package kubeletnode_test

import (
	"context"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dynamig/dynamig/deviceplugin/cdi"
	"github.com/dynamig/dynamig/deviceplugin/server"
	"github.com/dynamig/dynamig/test/kubeletnode"
	"github.com/dynamig/dynamig/test/probe/report"
)

// cdiAllocator answers Allocate with the CDI name of each device, as the device plugin does.
type cdiAllocator struct{ node string }

func (a cdiAllocator) Allocate(_ context.Context, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{}
	for _, id := range req.DevicesIds {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: cdi.QualifiedName(a.node, id)})
	}
	return resp, nil
}

// TestContainerdCDI: on real containerd, a device the plugin names by its CDI name (its
// spec written by deviceplugin/cdi into the node's spec directory) reaches the container as
// containerd resolves it: the spec's NVIDIA_VISIBLE_DEVICES replaces the container's own
// "void", and the spec's device node is in the container's /dev. On containerd 1.7 with CDI
// off, the container starts as if it had no device: its own "void", no device node.
func TestContainerdCDI(t *testing.T) {
	const mig = "MIG-5d2a9c3e-1f0b-5e8a-9c41-0a7b3c2d1e6f"
	for _, tc := range []struct {
		name, node string
		cdiOff     bool
		wantEnv    string
		wantDevice bool
	}{
		{"containerd 2.x applies CDI", "kd", false, mig, true},
		{"containerd 1.7 with CDI off ignores it", "ko", true, "void", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, client := kubeletnode.StartContainerdTestNode(t, tc.node, kubeletnode.ContainerdOptions{CDIOff: tc.cdiOff})
			specFiles, err := cdi.New(node.CDIDir)
			if err != nil {
				t.Fatal(err)
			}
			if err := specFiles.Write(tc.node, "mig0", cdispec.ContainerEdits{
				Env:         []string{"NVIDIA_VISIBLE_DEVICES=" + mig},
				DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", HostPath: "/dev/null"}},
			}); err != nil {
				t.Fatal(err)
			}
			srv, err := server.New(server.Options{ResourceName: res, SocketDir: node.DevicePluginDir, Allocator: cdiAllocator{node: tc.node},
				Devices: func() []*pluginapi.Device { return []*pluginapi.Device{{ID: "mig0", Health: pluginapi.Healthy}} }})
			if err != nil {
				t.Fatal(err)
			}
			startPlugin(t, srv)
			waitDevices(t, client, tc.node, res, 1, 1)

			p := runPod(t, client, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: v1.PodSpec{
				NodeName: tc.node, AutomountServiceAccountToken: ptr.To(false),
				Containers: []v1.Container{{Name: "main", Image: kubeletnode.ProbeImage, ImagePullPolicy: v1.PullNever,
					Env:       []v1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}},
					Resources: v1.ResourceRequirements{Limits: v1.ResourceList{res: resource.MustParse("1")}}}},
			}}, 2*time.Minute)
			var r report.Report
			waitFor(t, "the probe's report", time.Minute, func() (bool, string) {
				var err error
				r, err = node.ProbeReport(p, "main")
				if err != nil {
					return false, err.Error()
				}
				return true, ""
			})
			if got := r.Env["NVIDIA_VISIBLE_DEVICES"]; got != tc.wantEnv {
				t.Errorf("the container sees NVIDIA_VISIBLE_DEVICES=%q, want %s (report %+v)", got, tc.wantEnv, r)
			}
			if got := slices.Contains(r.Devices, "/dev/nvidia0"); got != tc.wantDevice {
				t.Errorf("the spec's /dev/nvidia0 in the container's /dev: %t, want %t (report %+v)", got, tc.wantDevice, r)
			}
		})
	}
}
