package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dynamig/dynamig/test/kubelet"
)

const gpu = "nvidia.com/gpu"

// socketDir is a temp dir short enough for unix socket paths (~107 bytes).
func socketDir(t *testing.T) string {
	t.Helper()
	if d := t.TempDir(); len(d) < 60 {
		return d
	}
	d, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// fakeDevices is a device list the test changes, signalling Changed.
type fakeDevices struct {
	mu      sync.Mutex
	devs    []*pluginapi.Device
	changed chan struct{}
}

func newFakeDevices(n int) *fakeDevices {
	f := &fakeDevices{changed: make(chan struct{}, 1)}
	for i := range n {
		f.devs = append(f.devs, &pluginapi.Device{ID: fmt.Sprintf("gpu-%d", i), Health: pluginapi.Healthy})
	}
	return f
}

func (f *fakeDevices) list() []*pluginapi.Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*pluginapi.Device, len(f.devs))
	for i, d := range f.devs {
		out[i] = &pluginapi.Device{ID: d.ID, Health: d.Health}
	}
	return out
}

func (f *fakeDevices) update(fn func(devs []*pluginapi.Device) []*pluginapi.Device) {
	f.mu.Lock()
	f.devs = fn(f.devs)
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// fakeAllocator records the device IDs of each call and answers with them in an env.
type fakeAllocator struct {
	mu    sync.Mutex
	calls [][]string
	err   error
}

func (a *fakeAllocator) Allocate(_ context.Context, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, slices.Clone(req.DevicesIds))
	if a.err != nil {
		return nil, a.err
	}
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DEVICES": strings.Join(req.DevicesIds, ",")}}, nil
}

func (a *fakeAllocator) Calls() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

func (a *fakeAllocator) setErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = err
}

type env struct {
	ctx     context.Context
	dir     string
	kubelet *kubelet.Kubelet
	devices *fakeDevices
	alloc   *fakeAllocator
	server  *Server
	cancel  context.CancelFunc
	runErr  chan error
}

// setup starts a test kubelet and a plugin with n devices, and waits for registration.
func setup(t *testing.T, n int) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancelAll := context.WithTimeout(ctx, 30*time.Second)
	t.Cleanup(cancelAll)
	e := &env{ctx: ctx, dir: socketDir(t), devices: newFakeDevices(n), alloc: &fakeAllocator{}}
	k, err := kubelet.Start(ctx, e.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	e.kubelet = k
	e.startPlugin(t)
	if err := k.WaitForResource(ctx, gpu, n); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) startPlugin(t *testing.T) {
	t.Helper()
	s, err := New(Options{
		ResourceName:  gpu,
		SocketDir:     e.dir,
		Devices:       e.devices.list,
		Changed:       e.devices.changed,
		Allocator:     e.alloc,
		RegisterRetry: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	e.server, e.cancel, e.runErr = s, cancel, make(chan error, 1)
	go func() { e.runErr <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-e.runErr
	})
}

func gpuPod(uid string, init int, apps ...int) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + uid, Namespace: "default", UID: types.UID(uid)}}
	limits := func(n int) v1.ResourceRequirements {
		if n == 0 {
			return v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}}
		}
		return v1.ResourceRequirements{Limits: v1.ResourceList{gpu: *resource.NewQuantity(int64(n), resource.DecimalSI)}}
	}
	if init > 0 {
		p.Spec.InitContainers = []v1.Container{{Name: "init", Resources: limits(init)}}
	}
	for i, n := range apps {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: fmt.Sprintf("c%d", i), Resources: limits(n)})
	}
	return p
}

func ids(devs []*pluginapi.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.ID+"="+d.Health)
	}
	return out
}

func TestRegisterAdvertisesDevices(t *testing.T) {
	e := setup(t, 3)
	want := []string{"gpu-0=Healthy", "gpu-1=Healthy", "gpu-2=Healthy"}
	if got := ids(e.kubelet.Devices(gpu)); !slices.Equal(got, want) {
		t.Errorf("kubelet sees %v, want %v", got, want)
	}
	if got := e.kubelet.Registrations(gpu); got != 1 {
		t.Errorf("registrations = %d, want 1", got)
	}
	opts := e.kubelet.Options(gpu)
	if opts == nil || opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Errorf("plugin options = %v, want both false", opts)
	}
	if got, want := e.server.SocketPath(), filepath.Join(e.dir, "dynamig-nvidia.com-gpu.sock"); got != want {
		t.Errorf("socket = %s, want %s", got, want)
	}
}

func TestChangedSendsNewList(t *testing.T) {
	e := setup(t, 3)
	e.devices.update(func(d []*pluginapi.Device) []*pluginapi.Device {
		d[1].Health = pluginapi.Unhealthy
		return d
	})
	wait(t, e, func(devs []*pluginapi.Device) bool {
		return slices.Equal(ids(devs), []string{"gpu-0=Healthy", "gpu-1=Unhealthy", "gpu-2=Healthy"})
	})
	e.devices.update(func(d []*pluginapi.Device) []*pluginapi.Device {
		return append(d, &pluginapi.Device{ID: "gpu-3", Health: pluginapi.Healthy})
	})
	wait(t, e, func(devs []*pluginapi.Device) bool { return len(devs) == 4 })
}

func wait(t *testing.T, e *env, cond func([]*pluginapi.Device) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if err := e.kubelet.WaitForDevices(ctx, gpu, cond); err != nil {
		t.Fatalf("%v; kubelet sees %v", err, ids(e.kubelet.Devices(gpu)))
	}
}

func TestAllocateGetsKubeletsDevices(t *testing.T) {
	e := setup(t, 4)
	p := gpuPod("a", 1, 2, 0, 1)
	resps, err := e.kubelet.Admit(e.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	inUse := e.kubelet.InUse(p.UID, gpu)
	wantCalls := [][]string{inUse["init"], inUse["c0"], inUse["c2"]}
	if got := e.alloc.Calls(); !slices.EqualFunc(got, wantCalls, slices.Equal) {
		t.Fatalf("Allocate calls %v, want kubelet's picks in container order %v", got, wantCalls)
	}
	if len(inUse["c0"]) != 2 || len(inUse["c2"]) != 1 || len(inUse["init"]) != 1 {
		t.Errorf("devices in use %v: want 1 for init, 2 for c0, 1 for c2", inUse)
	}
	for _, c := range []string{"init", "c0", "c2"} {
		if got, want := resps[c].GetEnvs()["DEVICES"], strings.Join(inUse[c], ","); got != want {
			t.Errorf("response for %s: DEVICES=%q, want %q", c, got, want)
		}
	}
	if _, ok := resps["c1"]; ok {
		t.Errorf("container c1 asks for no GPU but got a response")
	}

	// Admitting the same pod again (a container restart) does not call Allocate.
	if _, err := e.kubelet.Admit(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := len(e.alloc.Calls()); got != 3 {
		t.Errorf("Allocate calls after re-admission = %d, want still 3", got)
	}
}

func TestAllocatorErrorReachesAdmit(t *testing.T) {
	e := setup(t, 2)
	e.alloc.setErr(errors.New("no reservation for pod default/p-b"))
	p := gpuPod("b", 0, 1, 1)
	_, err := e.kubelet.Admit(e.ctx, p)
	if err == nil || !strings.Contains(err.Error(), "no reservation for pod default/p-b") {
		t.Fatalf("Admit error = %v, want the allocator's text", err)
	}
	if st := status.Convert(errors.Unwrap(err)); st.Message() != "no reservation for pod default/p-b" {
		t.Errorf("gRPC status message = %q (code %v), want exactly the allocator's text", st.Message(), st.Code())
	}
	if got := len(e.alloc.Calls()); got != 1 {
		t.Errorf("Allocate calls = %d, want 1 (admission stops at the first error)", got)
	}
	// A status error from the allocator keeps its code.
	e.alloc.setErr(status.Error(codes.FailedPrecondition, "busy"))
	if _, err := e.kubelet.Admit(e.ctx, p); status.Code(errors.Unwrap(err)) != codes.FailedPrecondition {
		t.Errorf("Admit error = %v, want code FailedPrecondition", err)
	}
	// The failed pod's devices were freed: both are available again.
	e.alloc.setErr(nil)
	if _, err := e.kubelet.Admit(e.ctx, p); err != nil {
		t.Fatalf("Admit after the allocator recovered: %v", err)
	}
}

func TestKubeletRestartReregisters(t *testing.T) {
	e := setup(t, 2)
	if _, err := e.kubelet.Admit(e.ctx, gpuPod("c", 0, 1)); err != nil {
		t.Fatal(err)
	}
	if err := e.kubelet.Restart(e.ctx); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if err := e.kubelet.WaitForResource(ctx, gpu, 2); err != nil {
		t.Fatalf("plugin did not re-register within 5s: %v (registrations %d)", err, e.kubelet.Registrations(gpu))
	}
	if got := e.kubelet.Registrations(gpu); got != 2 {
		t.Errorf("registrations = %d, want 2", got)
	}
	if _, err := os.Stat(e.server.SocketPath()); err != nil {
		t.Errorf("plugin socket not recreated: %v", err)
	}
	// The pod admitted before the restart keeps its device; the other is free.
	if _, err := e.kubelet.Admit(e.ctx, gpuPod("d", 0, 1)); err != nil {
		t.Fatalf("Admit after kubelet restart: %v", err)
	}
	if got := e.kubelet.InUse("d", gpu)["c0"]; !slices.Equal(got, []string{"gpu-1"}) {
		t.Errorf("pod d got %v, want [gpu-1] (gpu-0 is still pod c's)", got)
	}
	if got := len(e.alloc.Calls()); got != 2 {
		t.Errorf("Allocate calls = %d, want 2", got)
	}
}

func TestRegistersWhenKubeletComesLater(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	e := &env{ctx: ctx, dir: socketDir(t), devices: newFakeDevices(1), alloc: &fakeAllocator{}}
	e.startPlugin(t)
	time.Sleep(300 * time.Millisecond) // a few failed registrations
	k, err := kubelet.Start(ctx, e.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := k.WaitForResource(wctx, gpu, 1); err != nil {
		t.Fatal(err)
	}
}

func TestCancelRemovesSocket(t *testing.T) {
	e := setup(t, 2)
	if _, err := os.Stat(e.server.SocketPath()); err != nil {
		t.Fatal(err)
	}
	e.cancel()
	select {
	case err := <-e.runErr:
		e.runErr <- err // for the cleanup
		if err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := os.Stat(e.server.SocketPath()); !os.IsNotExist(err) {
		t.Errorf("socket still there after cancel: %v", err)
	}
	// kubelet saw the ListAndWatch stream end: the devices are unhealthy.
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(ids(e.kubelet.Devices(gpu)), []string{"gpu-0=Unhealthy", "gpu-1=Unhealthy"}) {
		if time.Now().After(deadline) {
			t.Fatalf("kubelet sees %v, want every device unhealthy", ids(e.kubelet.Devices(gpu)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunFailsWithoutSocketDir(t *testing.T) {
	s, err := New(Options{ResourceName: gpu, SocketDir: filepath.Join(socketDir(t), "missing"),
		Devices: newFakeDevices(1).list, Allocator: &fakeAllocator{}})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Run error = %v, want one naming the socket path", err)
	}
}

func TestNewValidates(t *testing.T) {
	ok := Options{ResourceName: gpu, SocketDir: "/tmp/x", Devices: func() []*pluginapi.Device { return nil }, Allocator: &fakeAllocator{}}
	for _, tc := range []struct {
		name  string
		edit  func(*Options)
		field string
	}{
		{"no resource", func(o *Options) { o.ResourceName = "" }, "ResourceName"},
		{"not qualified", func(o *Options) { o.ResourceName = "gpu" }, "ResourceName"},
		{"kubernetes.io", func(o *Options) { o.ResourceName = "kubernetes.io/gpu" }, "ResourceName"},
		{"bad chars", func(o *Options) { o.ResourceName = "nvidia.com/g pu" }, "ResourceName"},
		{"endpoint with slash", func(o *Options) { o.Endpoint = "a/b.sock" }, "Endpoint"},
		{"endpoint kubelet.sock", func(o *Options) { o.Endpoint = "kubelet.sock" }, "Endpoint"},
		{"no devices", func(o *Options) { o.Devices = nil }, "Devices"},
		{"no allocator", func(o *Options) { o.Allocator = nil }, "Allocator"},
		{"negative retry", func(o *Options) { o.RegisterRetry = -time.Second }, "RegisterRetry"},
		{"path too long", func(o *Options) { o.SocketDir = "/" + strings.Repeat("d", 120) }, "SocketDir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			_, err := New(o)
			if err == nil || !strings.Contains(err.Error(), "Options."+tc.field) {
				t.Errorf("New error = %v, want one naming Options.%s", err, tc.field)
			}
		})
	}
	s, err := New(Options{ResourceName: gpu, Devices: ok.Devices, Allocator: ok.Allocator})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.SocketPath(), pluginapi.DevicePluginPath+"dynamig-nvidia.com-gpu.sock"; got != want {
		t.Errorf("default socket = %s, want %s", got, want)
	}
	if s.opts.RegisterRetry != time.Second {
		t.Errorf("default RegisterRetry = %v, want 1s", s.opts.RegisterRetry)
	}
}
