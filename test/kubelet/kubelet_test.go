package kubelet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"
)

const res = "example.com/dev"

// stubPlugin is a bare device plugin, independent of deviceplugin/server.
type stubPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	updates chan []*pluginapi.Device
	grpc    *grpc.Server
	mu      sync.Mutex
	calls   [][]string
}

func (p *stubPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *stubPlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		select {
		case devs := <-p.updates:
			if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

func (p *stubPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		p.calls = append(p.calls, c.DevicesIds)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"IDS": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *stubPlugin) Calls() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

func devices(n int, unhealthy ...int) []*pluginapi.Device {
	var out []*pluginapi.Device
	for i := range n {
		h := pluginapi.Healthy
		if slices.Contains(unhealthy, i) {
			h = pluginapi.Unhealthy
		}
		out = append(out, &pluginapi.Device{ID: fmt.Sprintf("d%d", i), Health: h})
	}
	return out
}

// startStub serves a stub plugin in dir, registers it and sends devs.
func startStub(t *testing.T, ctx context.Context, dir string, devs []*pluginapi.Device) *stubPlugin {
	t.Helper()
	p := &stubPlugin{updates: make(chan []*pluginapi.Device, 10), grpc: grpc.NewServer()}
	pluginapi.RegisterDevicePluginServer(p.grpc, p)
	ln, err := net.Listen("unix", filepath.Join(dir, "stub.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go p.grpc.Serve(ln)
	t.Cleanup(p.grpc.Stop)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "stub.sock", ResourceName: res,
	}); err != nil {
		t.Fatal(err)
	}
	p.updates <- devs
	return p
}

func setup(t *testing.T, devs []*pluginapi.Device) (context.Context, *Kubelet, *stubPlugin) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	t.Cleanup(cancel)
	dir, err := os.MkdirTemp("", "kl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k, err := Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	p := startStub(t, ctx, dir, devs)
	if err := k.WaitForDevices(ctx, res, func(d []*pluginapi.Device) bool { return len(d) == len(devs) }); err != nil {
		t.Fatal(err)
	}
	return ctx, k, p
}

func container(name string, n int) v1.Container {
	return v1.Container{Name: name, Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
		res: *apiresource.NewQuantity(int64(n), apiresource.DecimalSI),
	}}}
}

func newPod(uid string, init []v1.Container, apps ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: uid, UID: types.UID(uid)},
		Spec:       v1.PodSpec{InitContainers: init, Containers: apps},
	}
}

func TestAdmitPicksFreeHealthyDevices(t *testing.T) {
	ctx, k, p := setup(t, devices(4, 1))
	if _, err := k.Admit(ctx, newPod("a", nil, container("c", 2))); err != nil {
		t.Fatal(err)
	}
	resps, err := k.Admit(ctx, newPod("b", nil, container("c", 1)))
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"d0", "d2"}, {"d3"}} // d1 is unhealthy
	if !slices.EqualFunc(p.Calls(), want, slices.Equal) {
		t.Errorf("Allocate calls %v, want %v", p.Calls(), want)
	}
	if got := resps["c"].Envs["IDS"]; got != "d3" {
		t.Errorf("response IDS=%q, want d3", got)
	}
	if _, err := k.Admit(ctx, newPod("c", nil, container("c", 1))); err == nil || !strings.Contains(err.Error(), "Available: 0") {
		t.Errorf("Admit with no free device: err = %v, want unavailable", err)
	}
	k.Release("a")
	if _, err := k.Admit(ctx, newPod("c", nil, container("c", 2))); err != nil {
		t.Errorf("Admit after Release: %v", err)
	}
}

func TestAdmitReusesInitContainerDevices(t *testing.T) {
	ctx, k, p := setup(t, devices(4))
	if _, err := k.Admit(ctx, newPod("a", []v1.Container{container("init", 1)}, container("app", 2))); err != nil {
		t.Fatal(err)
	}
	k.Release("a")
	// As kubelet: the sidecar takes over the finished init container's d0 and keeps it
	// (it leaves the reusable set), so the app gets fresh devices.
	sidecar := container("sidecar", 1)
	sidecar.RestartPolicy = ptr.To(v1.ContainerRestartPolicyAlways)
	pd := newPod("b", []v1.Container{container("init", 1), sidecar}, container("app", 2), v1.Container{Name: "plain"})
	resps, err := k.Admit(ctx, pd)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"d0"}, {"d0", "d1"}, {"d0"}, {"d0"}, {"d1", "d2"}}
	if !slices.EqualFunc(p.Calls(), want, slices.Equal) {
		t.Errorf("Allocate calls %v, want %v", p.Calls(), want)
	}
	if len(resps) != 3 || resps["app"].Envs["IDS"] != "d1,d2" {
		t.Errorf("responses %v, want init, sidecar and app (IDS=d1,d2)", resps)
	}
	// Admitting again (container restart) calls nothing.
	if _, err := k.Admit(ctx, pd); err != nil || len(p.Calls()) != 5 {
		t.Errorf("re-admission: err %v, %d calls, want none new", err, len(p.Calls()))
	}
}

func TestStreamEndMarksUnhealthyAndRestartDeletesSockets(t *testing.T) {
	ctx, k, p := setup(t, devices(2))
	p.grpc.Stop()
	if err := k.WaitFor(ctx, func() bool {
		r := k.resources[res]
		return r.client == nil && countHealthy(r.devices) == 0 && len(r.devices) == 2
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Admit(ctx, newPod("a", nil, container("c", 1))); err == nil {
		t.Error("Admit with the plugin gone succeeded")
	}
	if err := os.WriteFile(filepath.Join(k.SocketDir(), "checkpoint"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(k.SocketDir(), "other.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	defer ln.Close()
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(k.SocketDir(), "other.sock")); !os.IsNotExist(err) {
		t.Errorf("plugin socket survived Restart: %v", err)
	}
	if _, err := os.Stat(filepath.Join(k.SocketDir(), "checkpoint")); err != nil {
		t.Errorf("regular file removed by Restart: %v", err)
	}
	if k.Devices(res) != nil {
		t.Errorf("devices known right after Restart: %v", k.Devices(res))
	}
	startStub(t, ctx, k.SocketDir(), devices(1))
	if err := k.WaitForResource(ctx, res, 1); err != nil {
		t.Fatal(err)
	}
	if got := k.Registrations(res); got != 2 {
		t.Errorf("registrations = %d, want 2", got)
	}
}
