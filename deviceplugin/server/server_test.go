package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The kubelet-facing behaviour (registration, device lists, Allocate, PreStartContainer,
// kubelet restarts) is tested on the real kubelet in test/kubeletnode (server_test.go): the
// race run of deviceplugin/... must not build the API server.

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

func noDevices() []*pluginapi.Device { return nil }

// nopAllocator answers every container with nothing.
type nopAllocator struct{}

func (nopAllocator) Allocate(context.Context, *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{}, nil
}

func TestRunFailsWithoutSocketDir(t *testing.T) {
	s, err := New(Options{ResourceName: gpu, SocketDir: filepath.Join(socketDir(t), "missing"), Devices: noDevices, Allocator: nopAllocator{}})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Run error = %v, want one naming the socket path", err)
	}
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "Run called twice") {
		t.Errorf("second Run error = %v, want Run called twice", err)
	}
}

func TestNewValidates(t *testing.T) {
	ok := Options{ResourceName: gpu, SocketDir: "/tmp/x", Devices: noDevices, Allocator: nopAllocator{}}
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

type nopPreStarter struct{}

func (nopPreStarter) PreStartContainer(context.Context, []string) error { return nil }

// TestPluginOptions: PreStartRequired exactly when a PreStarter is set; never a preferred
// allocation.
func TestPluginOptions(t *testing.T) {
	for _, pre := range []PreStarter{nil, nopPreStarter{}} {
		s, err := New(Options{ResourceName: gpu, SocketDir: "/tmp/x", Devices: noDevices, Allocator: nopAllocator{}, PreStarter: pre})
		if err != nil {
			t.Fatal(err)
		}
		if o := s.pluginOptions(); o.PreStartRequired != (pre != nil) || o.GetPreferredAllocationAvailable {
			t.Errorf("PreStarter %v: options %v", pre, o)
		}
	}
}
