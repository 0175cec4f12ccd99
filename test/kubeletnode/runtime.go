package kubeletnode

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// Runtime is a CRI runtime for the kubelet: k8s.io/cri-client's fake, which runs nothing,
// with CreateContainer resolving the container's CDI devices against the spec directory
// through the CDI library containerd uses. A name that does not resolve fails the create,
// as containerd fails it; what resolved is recorded, so a test asserts what the container
// would see. Containers run until the test ends them (Exit).
//
// It answers Version and Status as containerd 1.7 does, its CRI configuration's enableCDI
// in the verbose info (what `crictl info` shows), so the device plugin's check of the
// runtime's CDI support reads what it reads on a real node.
type Runtime struct {
	*fake.RemoteRuntime
	server *grpc.Server
	cdi    *cdi.Cache
	cdiDir string
	opts   RuntimeOptions

	mu      sync.Mutex
	created []Container
	boot    int
}

// Container is what one CreateContainer resolved.
type Container struct {
	ID           string
	PodUID       types.UID
	PodNamespace string
	PodName      string
	Name         string
	Attempt      uint32
	// Boot counts the Reboots before this create: the fake derives container IDs from the
	// pod and attempt, so a container created again after a reboot has its old ID.
	Boot int
	// CDIDevices are the names the kubelet passed (from the device plugin's Allocate answer).
	CDIDevices []string
	// Env is the container's environment after CDI injection (the kubelet's own variables,
	// the Allocate answer's, and the CDI specs' edits).
	Env map[string]string
	// DeviceNodes are the device nodes the CDI specs added.
	DeviceNodes []string
}

// RuntimeOptions change what the runtime does with a container.
type RuntimeOptions struct {
	// IgnoreCDI drops the CDI device names the kubelet passes, as containerd 1.7 does with
	// its default enable_cdi = false: the container gets none of the specs' edits.
	IgnoreCDI bool
	// ImageEnv is the environment an image's config sets (a CUDA base image's
	// NVIDIA_VISIBLE_DEVICES=all), which the container's own variables override, as
	// containerd applies them; nil: images set none.
	ImageEnv func(image string) []string
}

// The runtime this fake answers as, in Version.
const (
	runtimeName    = "containerd"
	runtimeVersion = "v1.7.22"
)

// StartRuntime serves the runtime on the unix socket, resolving CDI names in cdiDir.
func StartRuntime(socket, cdiDir string, opts RuntimeOptions) (*Runtime, error) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache of %s: %w", cdiDir, err)
	}
	r := &Runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), server: grpc.NewServer(), cdi: cache, cdiDir: cdiDir, opts: opts}
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	r.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS}
	r.ImageService.SetFakeImageSize(1 << 20)
	runtimeapi.RegisterRuntimeServiceServer(r.server, r)
	runtimeapi.RegisterImageServiceServer(r.server, r)
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	go func() { _ = r.server.Serve(l) }()
	return r, nil
}

// Stop stops serving.
func (r *Runtime) Stop() { r.server.Stop() }

// Version names the runtime as containerd 1.7.
func (r *Runtime) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	resp, err := r.RemoteRuntime.Version(ctx, req)
	if err != nil {
		return nil, err
	}
	resp.RuntimeName, resp.RuntimeVersion = runtimeName, runtimeVersion
	return resp, nil
}

// Status adds, when verbose, containerd's CRI configuration as its info's "config".
func (r *Runtime) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	resp, err := r.RemoteRuntime.Status(ctx, req)
	if err != nil {
		return nil, err
	}
	if req.GetVerbose() {
		config, err := json.Marshal(map[string]any{"enableCDI": !r.opts.IgnoreCDI, "cdiSpecDirs": []string{r.cdiDir}})
		if err != nil {
			return nil, err
		}
		resp.Info = map[string]string{"config": string(config)}
	}
	return resp, nil
}

// CreateContainer resolves the CDI devices, then creates the container in the fake.
func (r *Runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	var names []string
	for _, d := range cfg.GetCDIDevices() {
		names = append(names, d.GetName())
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	// The image's variables first, the container's over them, the CDI edits last.
	if r.opts.ImageEnv != nil {
		spec.Process.Env = append(spec.Process.Env, r.opts.ImageEnv(cfg.GetImage().GetImage())...)
	}
	for _, kv := range cfg.GetEnvs() {
		spec.Process.Env = append(spec.Process.Env, kv.GetKey()+"="+string(kv.GetValue())) // bytes from cri-api 0.36
	}
	if len(names) > 0 && !r.opts.IgnoreCDI {
		// The spec directory is read at each create: the device plugin writes specs just
		// before (PreStartContainer), as containerd's cache would see them by then. Like
		// containerd, a bad spec file is only reported when a name does not resolve.
		refreshErr := r.cdi.Refresh()
		if unresolved, err := r.cdi.InjectDevices(spec, names...); err != nil {
			return nil, fmt.Errorf("CDI device injection failed: unresolvable CDI devices %s: %w (spec directory: %v)", strings.Join(unresolved, ", "), err, refreshErr)
		}
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	// A log path, as every real runtime reports one: the kubelet removes the files matching
	// "<log path>*" when it removes a container, and the fake's empty path made that "*",
	// every file of the kubelet's working directory.
	r.RuntimeService.Lock()
	if fc, ok := r.RuntimeService.Containers[resp.ContainerId]; ok {
		fc.LogPath = filepath.Join(req.GetSandboxConfig().GetLogDirectory(), cfg.GetLogPath())
	}
	r.RuntimeService.Unlock()
	sandbox := req.GetSandboxConfig().GetMetadata()
	c := Container{
		ID: resp.ContainerId, PodUID: types.UID(sandbox.GetUid()), PodNamespace: sandbox.GetNamespace(), PodName: sandbox.GetName(),
		Name: cfg.GetMetadata().GetName(), Attempt: cfg.GetMetadata().GetAttempt(), CDIDevices: names, Env: map[string]string{},
	}
	for _, kv := range spec.Process.Env { // a later variable replaces an earlier one, as in exec
		k, v, _ := strings.Cut(kv, "=")
		c.Env[k] = v
	}
	for _, d := range spec.Linux.Devices {
		c.DeviceNodes = append(c.DeviceNodes, d.Path)
	}
	r.mu.Lock()
	c.Boot = r.boot
	r.created = append(r.created, c)
	r.mu.Unlock()
	// The fake logs every call and never forgets; a long test would grow it without bound.
	r.RuntimeService.Lock()
	r.RuntimeService.Called = nil
	r.RuntimeService.Unlock()
	return resp, nil
}

// Created lists the containers created so far, oldest first.
func (r *Runtime) Created() []Container {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.created)
}

// Latest is the newest container created for the pod's container, if any.
func (r *Runtime) Latest(pod types.UID, container string) (Container, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.created) - 1; i >= 0; i-- {
		if c := r.created[i]; c.PodUID == pod && c.Name == container {
			return c, true
		}
	}
	return Container{}, false
}

// Exit ends the newest running container of the pod's container with the exit code, as a
// process that returned; the kubelet sees it at its next relist.
func (r *Runtime) Exit(pod types.UID, container string, code int32) error {
	c, ok := r.Latest(pod, container)
	if !ok {
		return fmt.Errorf("no container %s of pod %s was created", container, pod)
	}
	r.RuntimeService.Lock()
	defer r.RuntimeService.Unlock()
	fc, ok := r.RuntimeService.Containers[c.ID]
	if !ok || fc.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return fmt.Errorf("container %s (%s of pod %s) is not running", c.ID, container, pod)
	}
	fc.State, fc.ExitCode, fc.FinishedAt = runtimeapi.ContainerState_CONTAINER_EXITED, code, time.Now().UnixNano()
	return nil
}

// Reboot forgets every pod sandbox and container, as the runtime of a rebooted host has
// none: the kubelet that starts next creates them again. What was created stays recorded
// (Created, Latest).
func (r *Runtime) Reboot() {
	r.mu.Lock()
	r.boot++
	r.mu.Unlock()
	r.RuntimeService.Lock()
	defer r.RuntimeService.Unlock()
	clear(r.RuntimeService.Containers)
	clear(r.RuntimeService.Sandboxes)
}
