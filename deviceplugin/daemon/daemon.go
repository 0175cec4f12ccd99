// Package daemon runs the device plugin on one node: it publishes the inventory, renews
// the heartbeat, serves kubelet's device-plugin API (Allocate answers CDI names,
// PreStartContainer realises the scheduler's reservations and writes their CDI specs), and
// reclaims the instances of pods that ended.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/allocate"
	"github.com/dynamig/dynamig/deviceplugin/cdi"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/health"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
	"github.com/dynamig/dynamig/deviceplugin/podresources"
	"github.com/dynamig/dynamig/deviceplugin/publish"
	"github.com/dynamig/dynamig/deviceplugin/runtimecdi"
	"github.com/dynamig/dynamig/deviceplugin/server"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/signing"
)

// Options configure the daemon.
type Options struct {
	NodeName       string
	Client         kubernetes.Interface
	NVML           nvml.Interface
	DeviceConfig   *config.DeviceConfig
	SocketDir      string
	CheckpointPath string // default <SocketDir>/dynamig.checkpoint
	// PodResourcesSocket is the kubelet's PodResources API (default
	// /var/lib/kubelet/pod-resources/kubelet.sock).
	PodResourcesSocket string
	// CDISpecDir is where the containers' CDI specs are written (default /var/run/cdi).
	CDISpecDir     string
	LeaseNamespace string
	// Intervals; zero means the package defaults. HealthRecheck is how often an unhealthy
	// GPU is asked whether it is healthy again.
	InventoryInterval, HeartbeatInterval, ReclaimInterval, HealthRecheck time.Duration
	PreemptionWait                                                       time.Duration
	// ReclaimUnknownInstances lets restart recovery destroy idle instances that dynamig did
	// not create (operators opt in; by default they are only reported).
	ReclaimUnknownInstances bool
	// EnableMIGMode turns MIG mode on for GPUs of a mig node that have it off. Opt-in: the
	// change may need a GPU reset to take effect, which the plugin never does.
	EnableMIGMode bool
	// HAMiCoreHostDir holds HAMi-core's libvgpu.so and ld.so.preload on the host.
	HAMiCoreHostDir string
	// HAMiCoreLockDir is the host directory hami-core containers share HAMi-core's lock files
	// in (their /tmp/vgpulock); the plugin makes it, writable by every user as HAMi makes
	// it. "" mounts none.
	HAMiCoreLockDir string
	// DeviceEdits says what a container gets for its devices (default cdi.EnvOnly:
	// NVIDIA_VISIBLE_DEVICES only).
	DeviceEdits cdi.DeviceEdits
	// Clock is the node's clock (default: the real one).
	Clock clock.PassiveClock
	// IgnoredXIDs are the XIDs that leave a GPU healthy (default health.DefaultIgnoredXIDs;
	// an empty, non-nil list ignores none).
	IgnoredXIDs []uint64
	// RuntimeEndpoints are the container runtime's CRI sockets, the first that exists asked
	// whether it applies CDI devices (nil: runtimecdi.DefaultEndpoints; empty, non-nil: the
	// check is off).
	RuntimeEndpoints []string
	// Readiness, when set, reports the daemon's readiness (the plugin's /readyz).
	Readiness *Readiness
}

// Readiness says whether the device plugin serves the kubelet: its instances recovered, its
// first inventory published, and registered with the running kubelet. Its Check is the
// chart's readiness probe, so that a Ready plugin pod means GPUs can be allocated on the node.
type Readiness struct{ srv atomic.Pointer[server.Server] }

// Check is a healthz checker: nil once ready, else what it waits for.
func (r *Readiness) Check(*http.Request) error {
	switch srv := r.srv.Load(); {
	case srv == nil:
		return errors.New("starting: recovering the node's instances and publishing its inventory")
	case !srv.Registered():
		return errors.New("not registered with the kubelet")
	}
	return nil
}

// Run runs until ctx ends.
func Run(ctx context.Context, opts Options) error {
	logger := klog.FromContext(ctx).WithValues("node", opts.NodeName)
	ctx = klog.NewContext(ctx, logger)
	if opts.NodeName == "" || opts.Client == nil || opts.NVML == nil || opts.DeviceConfig == nil {
		return errors.New("daemon: NodeName, Client, NVML and DeviceConfig are required")
	}
	if opts.SocketDir == "" {
		opts.SocketDir = pluginapi.DevicePluginPath
	}
	if opts.CheckpointPath == "" {
		opts.CheckpointPath = filepath.Join(opts.SocketDir, "dynamig.checkpoint")
	}
	if opts.LeaseNamespace == "" {
		opts.LeaseNamespace = api.DefaultSystemNamespace
	}
	if opts.PodResourcesSocket == "" {
		opts.PodResourcesSocket = podresources.DefaultSocket
	}
	if opts.CDISpecDir == "" {
		opts.CDISpecDir = cdi.DefaultSpecDir
	}
	opts.InventoryInterval = orDefault(opts.InventoryInterval, publish.DefaultInventoryInterval)
	opts.HeartbeatInterval = orDefault(opts.HeartbeatInterval, publish.DefaultHeartbeatInterval)
	opts.ReclaimInterval = orDefault(opts.ReclaimInterval, 30*time.Second)

	if opts.EnableMIGMode && opts.DeviceConfig.Node(opts.NodeName).OperatingMode == api.ModeMIG {
		if err := enableMIGMode(ctx, opts.NVML); err != nil {
			return err
		}
	}
	mgr, err := instances.New(opts.NVML)
	if err != nil {
		return fmt.Errorf("indexing GPUs: %w", err)
	}
	cp, err := checkpoint.Open(opts.CheckpointPath)
	if err != nil {
		return err
	}
	verifier := signing.NewVerifier(opts.Client, opts.LeaseNamespace)
	if err := verifier.Start(ctx); err != nil {
		return fmt.Errorf("following the reservation public keys: %w", err)
	}
	owners, err := podresources.Dial(opts.PodResourcesSocket)
	if err != nil {
		return err
	}
	defer owners.Close()
	specDir, err := cdi.New(opts.CDISpecDir)
	if err != nil {
		return err
	}
	// One informer on this node's pods: PreStartContainer reads reservations from it, and
	// reclaim is woken by pods that end.
	factory := informers.NewSharedInformerFactoryWithOptions(opts.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", opts.NodeName).String()
	}))
	pods := factory.Core().V1().Pods()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: opts.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "dynamig-device-plugin", Host: opts.NodeName})
	// Whether the runtime applies the CDI names Allocate answers: asked before the kubelet is
	// served, so the first container's PreStart already knows.
	endpoints := opts.RuntimeEndpoints
	if endpoints == nil {
		endpoints = runtimecdi.DefaultEndpoints
	}
	runtimeCDI := &runtimecdi.Watcher{Endpoints: endpoints, OnChange: func(v runtimecdi.Verdict) { runtimeCDIEvent(recorder, opts.NodeName, v) }}
	runtimeCDI.Check(ctx)
	if dir := opts.HAMiCoreLockDir; dir != "" {
		// Sticky and writable by all, as /tmp: HAMi makes it 0777; any container user locks.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("HAMi-core's lock directory: %w", err)
		}
		if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
			return fmt.Errorf("HAMi-core's lock directory: %w", err)
		}
	}
	alloc, err := allocate.New(allocate.Options{NodeName: opts.NodeName, Client: opts.Client, Names: opts.DeviceConfig.Nvidia.ResourceNames,
		Instances: mgr, Checkpoint: cp, Verifier: verifier, Owners: owners, Specs: specDir, DeviceEdits: opts.DeviceEdits, Pods: pods.Lister(), Recorder: recorder,
		PreemptionWait: opts.PreemptionWait, RuntimeCDI: runtimeCDI.Current,
		HAMiCore: hamiCoreOptions(opts)})
	if err != nil {
		return err
	}
	defer metrics.AddSource(&metrics.Source{Instances: mgr, Checkpoint: cp, Node: opts.NodeName, RuntimeCDI: runtimeCDI.Current, Pods: pods.Lister()})()
	// Recovery first: kubelet is not served until our instances are known.
	if _, err := alloc.Recover(ctx, opts.ReclaimUnknownInstances); err != nil {
		logger.Error(err, "Restart recovery incomplete; continuing without destroying anything it could not verify")
	}
	if err := alloc.SweepSpecs(ctx); err != nil {
		logger.Info("CDI specs not swept at start; the reconcile loop retries", "err", err)
	}
	// The instances no reservation explains are told from this node's pods: the informer
	// syncs before the first inventory is published.
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("the informer of %v did not sync", typ)
		}
	}
	ignored := opts.IgnoredXIDs
	if ignored == nil {
		ignored = health.DefaultIgnoredXIDs
	}
	monitor := health.New(opts.NVML, ignored)
	if opts.HealthRecheck > 0 {
		monitor.Recheck = opts.HealthRecheck
	}
	pub := &publish.Publisher{Client: opts.Client, NodeName: opts.NodeName, NVML: opts.NVML, Config: opts.DeviceConfig, Unexplained: alloc.Unexplained, Unhealthy: monitor.Unhealthy}
	devs := &deviceList{changed: make(chan struct{}, 1)}
	res, _, err := pub.Publish(ctx)
	if err != nil {
		return err
	}
	devs.set(res.GPUs)
	srv, err := server.New(server.Options{ResourceName: opts.DeviceConfig.Nvidia.ResourceCountName, SocketDir: opts.SocketDir,
		Devices: devs.get, Changed: devs.changed, Allocator: alloc, PreStarter: alloc})
	if err != nil {
		return err
	}
	if opts.Readiness != nil {
		opts.Readiness.srv.Store(srv)
	}
	heartbeat := &publish.Heartbeat{Client: opts.Client, NodeName: opts.NodeName, Namespace: opts.LeaseNamespace, Duration: publish.DefaultHeartbeatDuration, Clock: opts.Clock}

	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	publishNow := make(chan struct{}, 1)
	run(func() {
		publishLoop(ctx, pub, devs, opts.InventoryInterval, publishNow)
	})
	// A GPU's health changes: published at once (the kubelet and the scheduler stop placing
	// pods there), and told in events on the Node and on the pods the GPU serves.
	monitor.OnChange = func(c health.Change) {
		healthEvents(ctx, recorder, opts.NodeName, pods.Lister(), c)
		select {
		case publishNow <- struct{}{}:
		default:
		}
	}
	run(func() {
		if err := monitor.Run(ctx); err != nil {
			logger.Error(err, "GPU health is judged by failing NVML calls only")
		}
	})
	run(func() { heartbeat.Run(ctx, opts.HeartbeatInterval) })
	run(func() { runtimeCDI.Run(ctx) })
	run(func() { reclaimLoop(ctx, opts, alloc, factory, pods.Informer(), publishNow) })
	err = srv.Run(ctx)
	wg.Wait()
	return err
}

// enableMIGMode asks for MIG mode on every GPU that has it off, and says which still need
// a reset.
func enableMIGMode(ctx context.Context, lib nvml.Interface) error {
	logger := klog.FromContext(ctx)
	n, err := lib.DeviceCount()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		dev, err := lib.DeviceByIndex(i)
		if err != nil {
			return err
		}
		current, pending, err := dev.MigMode()
		if err != nil || current {
			continue
		}
		if !pending {
			if err := dev.SetMigMode(true); err != nil {
				logger.Error(err, "Enabling MIG mode", "gpu", i)
				continue
			}
		}
		if current, _, _ = dev.MigMode(); !current {
			logger.Info("MIG mode is enabled but pending: the GPU needs a reset (drain it, then nvidia-smi -r)", "gpu", i)
		} else {
			logger.Info("Enabled MIG mode", "gpu", i)
		}
	}
	return nil
}

// hamiCoreOptions are HAMi-core's settings from the options and the device config (HAMi's
// keys: gpuCorePolicy, disablecorelimit "true" meaning the policy disable, libCudaLogLevel,
// resourcePriorityName).
func hamiCoreOptions(opts Options) allocate.HAMiCoreOptions {
	nv := opts.DeviceConfig.Nvidia
	policy := nv.GPUCorePolicy
	if on, err := strconv.ParseBool(nv.DisableCoreLimit); err == nil && on {
		policy = "disable"
	}
	return allocate.HAMiCoreOptions{HostDir: opts.HAMiCoreHostDir, LockDir: opts.HAMiCoreLockDir, MemoryScaling: memoryScaling(opts.DeviceConfig, opts.NodeName),
		CorePolicy: policy, LogLevel: nv.LibCudaLogLevel, Priority: v1.ResourceName(nv.ResourcePriorityName)}
}

// memoryScaling is the node's deviceMemoryScaling (nodeconfig first, then the nvidia section).
func memoryScaling(cfg *config.DeviceConfig, node string) float64 {
	if n := cfg.Node(node); n.DeviceMemoryScaling != nil {
		return *n.DeviceMemoryScaling
	}
	return cfg.Nvidia.DeviceMemoryScaling
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func publishLoop(ctx context.Context, pub *publish.Publisher, devs *deviceList, every time.Duration, now <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-now:
		}
		res, _, err := pub.Publish(ctx)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Inventory not published")
			continue
		}
		devs.set(res.GPUs)
	}
}

// reclaimLoop reclaims instances of ended pods, and removes the CDI specs of devices no
// container holds, periodically and whenever a pod on this node is deleted or ends, as an
// informer on this node's pods reports it (no full LIST every few seconds).
//
// After each pass it asks for the inventory to be published: what the pass kept, or the
// instances it destroyed, change the instances no reservation explains.
func reclaimLoop(ctx context.Context, opts Options, alloc *allocate.Allocator, factory informers.SharedInformerFactory, informer cache.SharedIndexInformer, publishNow chan<- struct{}) {
	logger := klog.FromContext(ctx)
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*v1.Pod); ok && (p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed) {
				poke()
			}
		},
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		logger.Error(err, "Watching pods")
	}
	t := time.NewTicker(opts.ReclaimInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			factory.Shutdown()
			return
		case <-t.C:
		case <-kick:
		}
		if err := alloc.Reclaim(ctx); err != nil {
			logger.Info("Reclaim incomplete; the next pass retries", "err", err)
		}
		if err := alloc.SweepSpecs(ctx); err != nil {
			logger.Info("CDI specs not swept; the next pass retries", "err", err)
		}
		select {
		case publishNow <- struct{}{}:
		default:
		}
	}
}

// deviceList is what the plugin advertises: per GPU, as many devices as it can hold at
// once (MIG: its most concurrent instances; hami-core: deviceSplitCount).
type deviceList struct {
	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{}
}

func (d *deviceList) set(gpus []api.GPU) {
	var out []*pluginapi.Device
	for _, g := range gpus {
		health := pluginapi.Healthy
		if !g.Health {
			health = pluginapi.Unhealthy
		}
		for i := 0; i < g.Count; i++ {
			out = append(out, &pluginapi.Device{ID: g.ID + "::" + strconv.Itoa(i), Health: health})
		}
	}
	d.mu.Lock()
	same := equalDevices(d.devices, out)
	d.devices = out
	d.mu.Unlock()
	if !same {
		select {
		case d.changed <- struct{}{}:
		default:
		}
	}
}

func (d *deviceList) get() []*pluginapi.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.devices
}

func equalDevices(a, b []*pluginapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Health != b[i].Health {
			return false
		}
	}
	return true
}
