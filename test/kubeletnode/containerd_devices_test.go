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

// TestContainerdResolvesCDI: on real containerd, a device the plugin names by its CDI name
// (its spec written by deviceplugin/cdi into the node's spec directory) reaches the
// container as containerd resolves it: the spec's NVIDIA_VISIBLE_DEVICES replaces the
// container's own "void", and the spec's device node is in the container's /dev.
func TestContainerdResolvesCDI(t *testing.T) {
	const name, mig = "kd", "MIG-5d2a9c3e-1f0b-5e8a-9c41-0a7b3c2d1e6f"
	node, client := kubeletnode.StartContainerdTestNode(t, name)
	specFiles, err := cdi.New(node.CDIDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := specFiles.Write(name, "mig0", cdispec.ContainerEdits{
		Env:         []string{"NVIDIA_VISIBLE_DEVICES=" + mig},
		DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", HostPath: "/dev/null"}},
	}); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Options{ResourceName: res, SocketDir: node.DevicePluginDir, Allocator: cdiAllocator{node: name},
		Devices: func() []*pluginapi.Device { return []*pluginapi.Device{{ID: "mig0", Health: pluginapi.Healthy}} }})
	if err != nil {
		t.Fatal(err)
	}
	startPlugin(t, srv)
	waitDevices(t, client, name, res, 1, 1)

	p := runPod(t, client, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: v1.PodSpec{
		NodeName: name, AutomountServiceAccountToken: ptr.To(false),
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
	if got := r.Env["NVIDIA_VISIBLE_DEVICES"]; got != mig {
		t.Errorf("the container sees NVIDIA_VISIBLE_DEVICES=%q, want the CDI spec's %s (report %+v)", got, mig, r)
	}
	if !slices.Contains(r.Devices, "/dev/nvidia0") {
		t.Errorf("the container's /dev lacks the spec's /dev/nvidia0 (report %+v)", r)
	}
}
