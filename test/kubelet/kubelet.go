// Package kubelet is a test kubelet: the device-plugin half of kubelet's device manager
// (registration, ListAndWatch, Allocate at pod admission, restart), small enough to run in a
// test or an in-process sandbox.
//
// kubelet's own devicemanager package is not used: NewManagerImpl hard-codes its socket
// (pluginapi.KubeletSocket under /var/lib/kubelet) and needs the container manager's
// topology, checkpoint and pod sources around it.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// connectTimeout bounds dialling a plugin and GetDevicePluginOptions, as kubelet's dial does.
const connectTimeout = 10 * time.Second

// Kubelet serves the Registration service on <socketDir>/kubelet.sock and talks to the
// plugins that register there.
type Kubelet struct {
	dir    string
	logger klog.Logger

	// admitMu serialises Admit, as kubelet admits one pod at a time.
	admitMu sync.Mutex

	mu        sync.Mutex
	grpc      *grpc.Server
	serveDone chan struct{}
	resources map[string]*resource
	pods      map[types.UID]*pod
	// notify is closed (and replaced) on every change Wait* may be waiting for.
	notify chan struct{}
	wg     sync.WaitGroup // ListAndWatch receivers
}

// resource is what kubelet knows of one registered resource.
type resource struct {
	name          string
	client        *pluginClient // nil while no plugin is connected
	options       *pluginapi.DevicePluginOptions
	registrations int
	// devices in the order the plugin last listed them.
	devices []*pluginapi.Device
}

type pluginClient struct {
	endpoint string
	conn     *grpc.ClientConn
	api      pluginapi.DevicePluginClient
	cancel   context.CancelFunc
}

// pod is a pod's device assignment, as kubelet's podDevices checkpoint holds it.
type pod struct {
	// devices: container → resource → device IDs.
	devices   map[string]map[string][]string
	responses map[string]*pluginapi.ContainerAllocateResponse
}

// Start serves Registration on <socketDir>/kubelet.sock, first deleting every socket in
// socketDir as kubelet does when it starts.
func Start(ctx context.Context, socketDir string) (*Kubelet, error) {
	dir, err := filepath.Abs(socketDir)
	if err != nil {
		return nil, err
	}
	k := &Kubelet{
		dir:       dir,
		logger:    klog.FromContext(ctx).WithName("test-kubelet"),
		resources: map[string]*resource{},
		pods:      map[types.UID]*pod{},
		notify:    make(chan struct{}),
	}
	if err := k.serve(); err != nil {
		return nil, err
	}
	return k, nil
}

// SocketDir is the directory of kubelet.sock and the plugins' sockets.
func (k *Kubelet) SocketDir() string { return k.dir }

func (k *Kubelet) serve() error {
	if err := os.MkdirAll(k.dir, 0o750); err != nil {
		return err
	}
	if err := removeSockets(k.dir); err != nil {
		return err
	}
	ln, err := net.Listen("unix", filepath.Join(k.dir, "kubelet.sock"))
	if err != nil {
		return fmt.Errorf("test kubelet: %w", err)
	}
	g := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(g, &registration{k: k})
	done := make(chan struct{})
	k.mu.Lock()
	k.grpc, k.serveDone = g, done
	k.mu.Unlock()
	go func() {
		defer close(done)
		_ = g.Serve(ln)
	}()
	return nil
}

// removeSockets deletes every socket file in dir, as kubelet's CleanupPluginDirectory does:
// a plugin takes its socket's disappearance as the signal to register again.
func removeSockets(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.Type()&fs.ModeSocket == 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stop stops serving and disconnects every plugin.
func (k *Kubelet) stop() {
	k.mu.Lock()
	g, done := k.grpc, k.serveDone
	k.grpc, k.serveDone = nil, nil
	var clients []*pluginClient
	for _, r := range k.resources {
		if r.client != nil {
			clients = append(clients, r.client)
			r.client = nil
		}
	}
	k.mu.Unlock()
	if g != nil {
		g.Stop()
		<-done
	}
	for _, c := range clients {
		c.cancel()
		c.conn.Close()
	}
	k.wg.Wait()
}

// Stop stops serving and disconnects every plugin.
func (k *Kubelet) Stop() {
	k.stop()
	k.changed()
}

// Restart simulates a kubelet restart: stop serving, delete every socket in the directory
// (plugins' included), serve Registration again. As after a real restart, pod assignments
// survive (kubelet's checkpoint) but every resource has no devices until its plugin
// registers again.
func (k *Kubelet) Restart(ctx context.Context) error {
	k.stop()
	k.mu.Lock()
	for _, r := range k.resources {
		r.devices = nil
		r.options = nil
	}
	k.mu.Unlock()
	k.changed()
	if err := ctx.Err(); err != nil {
		return err
	}
	return k.serve()
}

func (k *Kubelet) changed() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.changedLocked()
}

func (k *Kubelet) changedLocked() {
	close(k.notify)
	k.notify = make(chan struct{})
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	k *Kubelet
}

// Register does what kubelet's does: check the version and name, dial the plugin's
// endpoint and call GetDevicePluginOptions before answering, then watch its devices.
func (r *registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := r.k
	logger := k.logger.WithValues("resource", req.ResourceName, "endpoint", req.Endpoint)
	if req.Version != pluginapi.Version {
		return &pluginapi.Empty{}, fmt.Errorf("requested device plugin API version %s is not supported by kubelet; supported versions are %v", req.Version, pluginapi.SupportedVersions)
	}
	if !isExtendedResourceName(req.ResourceName) {
		return &pluginapi.Empty{}, fmt.Errorf("cannot register resource %q: invalid extended resource name", req.ResourceName)
	}
	if req.Endpoint == "" || req.Endpoint != filepath.Base(req.Endpoint) {
		return &pluginapi.Empty{}, fmt.Errorf("bad endpoint %q", req.Endpoint)
	}
	path := filepath.Join(k.dir, req.Endpoint)
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return &pluginapi.Empty{}, fmt.Errorf("failed to dial device plugin: %w", err)
	}
	api := pluginapi.NewDevicePluginClient(conn)
	octx, cancel := context.WithTimeout(ctx, connectTimeout)
	opts, err := api.GetDevicePluginOptions(octx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	cancel()
	if err != nil {
		conn.Close()
		return &pluginapi.Empty{}, fmt.Errorf("failed to get device plugin options: %w", err)
	}

	sctx, scancel := context.WithCancel(context.Background())
	c := &pluginClient{endpoint: req.Endpoint, conn: conn, api: api, cancel: scancel}
	k.mu.Lock()
	if k.grpc == nil {
		k.mu.Unlock()
		scancel()
		conn.Close()
		return &pluginapi.Empty{}, errors.New("kubelet is stopping")
	}
	res := k.resources[req.ResourceName]
	if res == nil {
		res = &resource{name: req.ResourceName}
		k.resources[req.ResourceName] = res
	}
	old := res.client
	res.client, res.options = c, opts
	res.registrations++
	k.wg.Add(1)
	k.changedLocked()
	k.mu.Unlock()
	if old != nil {
		old.cancel()
		old.conn.Close()
	}
	logger.Info("Device plugin registered")
	go k.listAndWatch(sctx, logger, res, c)
	return &pluginapi.Empty{}, nil
}

// listAndWatch records each device list the plugin sends. When the stream ends, the
// plugin's devices turn unhealthy, as in kubelet's PluginDisconnected.
func (k *Kubelet) listAndWatch(ctx context.Context, logger klog.Logger, res *resource, c *pluginClient) {
	defer k.wg.Done()
	stream, err := c.api.ListAndWatch(ctx, &pluginapi.Empty{})
	for err == nil {
		var resp *pluginapi.ListAndWatchResponse
		if resp, err = stream.Recv(); err != nil {
			break
		}
		k.mu.Lock()
		if res.client == c {
			res.devices = resp.Devices
			k.changedLocked()
		}
		k.mu.Unlock()
		logger.V(2).Info("Device plugin sent devices", "count", len(resp.Devices))
	}
	if ctx.Err() == nil {
		logger.Info("ListAndWatch ended", "err", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if res.client != c {
		return // replaced by a newer registration, or kubelet stopping
	}
	res.client = nil
	c.cancel()
	c.conn.Close()
	devs := make([]*pluginapi.Device, 0, len(res.devices))
	for _, d := range res.devices {
		d = cloneDevice(d)
		d.Health = pluginapi.Unhealthy
		devs = append(devs, d)
	}
	res.devices = devs
	k.changedLocked()
}

// isExtendedResourceName is v1helper.IsExtendedResourceName without importing kubernetes.
func isExtendedResourceName(name string) bool {
	i := strings.Index(name, "/")
	if i <= 0 || strings.HasPrefix(name, "requests.") {
		return false
	}
	domain := name[:i]
	return domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io")
}

func cloneDevice(d *pluginapi.Device) *pluginapi.Device {
	c := &pluginapi.Device{ID: d.ID, Health: d.Health}
	if d.Topology != nil {
		c.Topology = &pluginapi.TopologyInfo{}
		for _, n := range d.Topology.Nodes {
			c.Topology.Nodes = append(c.Topology.Nodes, &pluginapi.NUMANode{ID: n.ID})
		}
	}
	return c
}

// Devices is the latest device list of resource, healthy and unhealthy, in the plugin's
// order; nil if no plugin ever registered it (or kubelet restarted since).
func (k *Kubelet) Devices(resource string) []*pluginapi.Device {
	k.mu.Lock()
	defer k.mu.Unlock()
	r := k.resources[resource]
	if r == nil || r.devices == nil {
		return nil
	}
	out := make([]*pluginapi.Device, len(r.devices))
	for i, d := range r.devices {
		out[i] = cloneDevice(d)
	}
	return out
}

// Registrations is how many times a plugin registered resource with this kubelet.
func (k *Kubelet) Registrations(resource string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if r := k.resources[resource]; r != nil {
		return r.registrations
	}
	return 0
}

// Options is what the connected plugin of resource answered to GetDevicePluginOptions; nil
// while none is connected.
func (k *Kubelet) Options(resource string) *pluginapi.DevicePluginOptions {
	k.mu.Lock()
	defer k.mu.Unlock()
	if r := k.resources[resource]; r != nil && r.client != nil {
		return r.options
	}
	return nil
}

// WaitFor waits until cond holds, checking it after every registration, device list and
// disconnection. cond runs under the kubelet's lock: it must not call back into k.
func (k *Kubelet) WaitFor(ctx context.Context, cond func() bool) error {
	for {
		k.mu.Lock()
		ok, ch := cond(), k.notify
		k.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// WaitForDevices waits until the connected plugin of resource advertises a device list
// for which cond holds.
func (k *Kubelet) WaitForDevices(ctx context.Context, resource string, cond func([]*pluginapi.Device) bool) error {
	err := k.WaitFor(ctx, func() bool {
		r := k.resources[resource]
		return r != nil && r.client != nil && r.devices != nil && cond(r.devices)
	})
	if err != nil {
		return fmt.Errorf("waiting for devices of %s: %w", resource, err)
	}
	return nil
}

// WaitForResource waits until a connected plugin advertises at least n healthy devices of
// resource.
func (k *Kubelet) WaitForResource(ctx context.Context, resource string, n int) error {
	return k.WaitForDevices(ctx, resource, func(devs []*pluginapi.Device) bool {
		return countHealthy(devs) >= n
	})
}

func countHealthy(devs []*pluginapi.Device) int {
	n := 0
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// Admit does what kubelet's device manager does when it admits pod: for each container,
// init containers first, each resource of a registered plugin in its limits gets that many
// free healthy devices and one Allocate call with one ContainerAllocateRequest. Devices of
// a (non-restartable) init container are reused by the containers after it, as kubelet
// does. Free devices are taken in the plugin's order; kubelet's own order is unspecified,
// so plugins must not depend on it. The responses are keyed by container name (merged when
// a container has several such resources). An error frees the pod's devices. Admitting a
// pod again returns its first responses without calling Allocate, as kubelet does not
// allocate again when a container restarts.
func (k *Kubelet) Admit(ctx context.Context, p *v1.Pod) (map[string]*pluginapi.ContainerAllocateResponse, error) {
	k.admitMu.Lock()
	defer k.admitMu.Unlock()

	k.mu.Lock()
	if done := k.pods[p.UID]; done != nil {
		k.mu.Unlock()
		return maps.Clone(done.responses), nil
	}
	st := &pod{devices: map[string]map[string][]string{}, responses: map[string]*pluginapi.ContainerAllocateResponse{}}
	k.pods[p.UID] = st
	k.mu.Unlock()

	reuse := map[string][]string{} // resource → devices an app container may take over
	admit := func(c *v1.Container, init bool) error {
		for _, name := range k.deviceResources(c) {
			q := c.Resources.Limits[v1.ResourceName(name)]
			needed := int(q.Value())
			if needed <= 0 {
				continue
			}
			ids, client, err := k.pick(p.UID, name, needed, reuse[name])
			if err != nil {
				return fmt.Errorf("container %q: %w", c.Name, err)
			}
			k.mu.Lock()
			if st.devices[c.Name] == nil {
				st.devices[c.Name] = map[string][]string{}
			}
			st.devices[c.Name][name] = ids
			k.mu.Unlock()
			resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
			})
			if err != nil {
				return fmt.Errorf("container %q: Allocate failed due to %w, which is unexpected", c.Name, err)
			}
			if n := len(resp.GetContainerResponses()); n != 1 {
				return fmt.Errorf("container %q: Allocate returned %d container responses for 1 request", c.Name, n)
			}
			st.responses[c.Name] = merge(st.responses[c.Name], resp.ContainerResponses[0])
			if init && !isRestartable(c) {
				reuse[name] = unionIDs(reuse[name], ids)
			} else {
				reuse[name] = slices.DeleteFunc(slices.Clone(reuse[name]), func(id string) bool { return slices.Contains(ids, id) })
			}
		}
		return nil
	}
	var err error
	for i := range p.Spec.InitContainers {
		if err = admit(&p.Spec.InitContainers[i], true); err != nil {
			break
		}
	}
	for i := 0; err == nil && i < len(p.Spec.Containers); i++ {
		err = admit(&p.Spec.Containers[i], false)
	}
	if err != nil {
		k.Release(p.UID)
		return nil, err
	}
	return maps.Clone(st.responses), nil
}

// deviceResources lists, sorted, the resources in c's limits that a plugin registered.
func (k *Kubelet) deviceResources(c *v1.Container) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for name := range c.Resources.Limits {
		if k.resources[string(name)] != nil {
			out = append(out, string(name))
		}
	}
	slices.Sort(out)
	return out
}

// pick chooses needed devices of resource for a container of pod uid: reusable ones
// first, then free healthy ones. The caller records them in the pod.
func (k *Kubelet) pick(uid types.UID, resource string, needed int, reusable []string) ([]string, pluginapi.DevicePluginClient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r := k.resources[resource]
	if r.client == nil {
		return nil, nil, fmt.Errorf("no device plugin connected for %s", resource)
	}
	healthy := map[string]bool{}
	for _, d := range r.devices {
		if d.Health == pluginapi.Healthy {
			healthy[d.ID] = true
		}
	}
	if len(healthy) == 0 {
		return nil, nil, fmt.Errorf("no healthy devices present; cannot allocate unhealthy devices %s", resource)
	}
	ids := slices.Clone(reusable[:min(needed, len(reusable))])
	inUse := map[string]bool{}
	for _, st := range k.pods {
		for _, byRes := range st.devices {
			for _, id := range byRes[resource] {
				inUse[id] = true
			}
		}
	}
	var available []string
	for _, d := range r.devices {
		if healthy[d.ID] && !inUse[d.ID] {
			available = append(available, d.ID)
		}
	}
	rest := needed - len(ids)
	if len(available) < rest {
		return nil, nil, fmt.Errorf("requested number of devices unavailable for %s. Requested: %d, Available: %d", resource, rest, len(available))
	}
	return append(ids, available[:rest]...), r.client.api, nil
}

// InUse lists the devices of resource assigned to pod uid, per container name.
func (k *Kubelet) InUse(uid types.UID, resource string) map[string][]string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string][]string{}
	if st := k.pods[uid]; st != nil {
		for c, byRes := range st.devices {
			if ids := byRes[resource]; len(ids) > 0 {
				out[c] = slices.Clone(ids)
			}
		}
	}
	return out
}

// Release frees pod uid's devices, as kubelet does once the pod is deleted.
func (k *Kubelet) Release(uid types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.pods, uid)
}

func isRestartable(c *v1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

func unionIDs(a, b []string) []string {
	out := slices.Clone(a)
	for _, id := range b {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// merge combines the responses for several resources of one container, as the runtime
// sees them: all envs, mounts, devices, annotations and CDI devices.
func merge(a, b *pluginapi.ContainerAllocateResponse) *pluginapi.ContainerAllocateResponse {
	if a == nil {
		return b
	}
	out := &pluginapi.ContainerAllocateResponse{
		Envs:        maps.Clone(a.Envs),
		Mounts:      slices.Concat(a.Mounts, b.Mounts),
		Devices:     slices.Concat(a.Devices, b.Devices),
		Annotations: maps.Clone(a.Annotations),
		CdiDevices:  slices.Concat(a.CdiDevices, b.CdiDevices),
	}
	if out.Envs == nil && b.Envs != nil {
		out.Envs = map[string]string{}
	}
	maps.Copy(out.Envs, b.Envs)
	if out.Annotations == nil && b.Annotations != nil {
		out.Annotations = map[string]string{}
	}
	maps.Copy(out.Annotations, b.Annotations)
	return out
}
