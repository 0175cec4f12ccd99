package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/cmd/dynamig-device-plugin/app"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/test/kubelet"
)

// Simulated node resources besides the GPUs.
var nodeResources = v1.ResourceList{
	v1.ResourceCPU:    resource.MustParse("32"),
	v1.ResourceMemory: resource.MustParse("256Gi"),
	v1.ResourcePods:   resource.MustParse("110"),
}

// node is one simulated node: its kubelet stand-in (device manager, pod admission, pod
// status), its device plugin, and the Node object.
type node struct {
	s           *Sandbox
	cfg         NodeConfig
	client      kubernetes.Interface // the node's kubelet identity
	socketDir   string
	metricsAddr string
	resource    string // the count resource name (nvidia.com/gpu)

	kl *kubelet.Kubelet
	// gpus is the node's simulated hardware; it outlives device-plugin restarts, as real
	// GPUs and their MIG instances do.
	gpus         *sim.Sim
	dpKubeconfig string
	queue        workqueue.TypedRateLimitingInterface[string]
	store        cache.Store
	dpCancel     context.CancelFunc
	dpDone       chan struct{}
	dpOut        syncBuffer
	dpCode       int
	wg           sync.WaitGroup

	mu       sync.Mutex
	gpuUUIDs []string
	// published is the {all, healthy} device count the Node advertises; publishing is set
	// while publishDevices writes a new one (see devicesPublished).
	published  [2]int
	publishing bool
	// pods the stand-in knows, by namespace/name: their UID and what it did.
	pods map[string]*podState
}

type podState struct {
	uid      types.UID
	admitted bool  // Admit was called
	admitErr error // its result
	status   bool  // the Running or Failed status was written
}

func (s *Sandbox) newNode(cfg NodeConfig) (*node, error) {
	n := &node{s: s, cfg: cfg, resource: s.devCfg.Nvidia.ResourceCountName, pods: map[string]*podState{}}
	var err error
	if n.client, err = s.cp.Client(nodeUser(cfg.Name)); err != nil {
		return n, err
	}
	// A short path: unix socket paths are limited to 108 bytes.
	if n.socketDir, err = os.MkdirTemp("", "dp"); err != nil {
		return n, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return n, err
	}
	n.metricsAddr = ln.Addr().String()
	ln.Close()
	specs := make([]sim.GPUSpec, len(cfg.GPUs))
	for i, g := range cfg.GPUs {
		specs[i] = sim.GPUSpec{Model: g}
	}
	sim.SetMIGModeFor(specs, cfg.Mode)
	if n.gpus, err = sim.New(sim.Options{Seed: cfg.Name, CreateLatency: s.createLatency}, specs...); err != nil {
		return n, err
	}
	return n, n.gpus.Init()
}

func (n *node) info() NodeInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	return NodeInfo{Name: n.cfg.Name, DeviceMetrics: n.metricsURL(), Mode: n.cfg.Mode,
		GPUs: append([]string(nil), n.cfg.GPUs...), GPUUUIDs: append([]string(nil), n.gpuUUIDs...)}
}

func (n *node) metricsURL() string { return "http://" + n.metricsAddr + "/metrics" }

// start registers the Node as kubelet does, starts the kubelet stand-in and the device
// plugin, and the pod loop.
func (n *node) start(ctx context.Context, dpKubeconfig string) error {
	name := n.cfg.Name
	created, err := n.client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		v1.LabelHostname: name, v1.LabelOSStable: runtime.GOOS, v1.LabelArchStable: runtime.GOARCH,
	}}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("registering the Node: %w", err)
	}
	now := metav1.Now()
	created.Status = v1.NodeStatus{
		Capacity:    nodeResources.DeepCopy(),
		Allocatable: nodeResources.DeepCopy(),
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
			Message: "dynamig-sandbox kubelet stand-in is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}},
		Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: name}},
		NodeInfo:  v1.NodeSystemInfo{OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH, KubeletVersion: "dynamig-sandbox"},
	}
	if _, err := n.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("posting the Node's status: %w", err)
	}

	if n.kl, err = kubelet.Start(klog.NewContext(n.s.ctx, klog.Background().WithValues("node", name)), n.socketDir); err != nil {
		return err
	}
	n.dpKubeconfig = dpKubeconfig
	n.startDevicePlugin()

	// The pod loop: an informer on this node's pods feeds one worker, as kubelet admits one
	// pod at a time.
	n.queue = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 5*time.Second))
	factory := informers.NewSharedInformerFactoryWithOptions(n.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", name).String()
	}))
	inf := factory.Core().V1().Pods().Informer()
	n.store = inf.GetStore()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			n.queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	factory.Start(n.s.ctx.Done())
	n.wg.Add(3)
	go func() {
		defer n.wg.Done()
		<-n.s.ctx.Done()
		n.queue.ShutDown()
		factory.Shutdown()
	}()
	go func() {
		defer n.wg.Done()
		if !cache.WaitForCacheSync(n.s.ctx.Done(), inf.HasSynced) {
			return
		}
		for n.processNext() {
		}
	}()
	go func() {
		defer n.wg.Done()
		n.publishDevices(n.s.ctx)
	}()
	return nil
}

// startDevicePlugin runs `dynamig-device-plugin run` in-process on the node's simulated
// GPUs until the sandbox stops or restartDevicePlugin.
func (n *node) startDevicePlugin() {
	args := []string{"run", "--nvml=sim", "--sim-gpus=" + strings.Join(n.cfg.GPUs, ","), "--node-name=" + n.cfg.Name,
		"--kubeconfig=" + n.dpKubeconfig, "--kubelet-socket-dir=" + n.socketDir, "--metrics-bind-address=" + n.metricsAddr,
		"--config=" + n.s.deviceConfig}
	ctx, cancel := context.WithCancel(n.s.ctx)
	done := make(chan struct{})
	n.mu.Lock()
	n.dpCancel, n.dpDone = cancel, done
	n.mu.Unlock()
	go func() {
		defer close(done)
		out := io.MultiWriter(&n.dpOut, n.s.log)
		code := app.MainContext(ctx, args, out, out, app.WithNVML(n.gpus))
		n.mu.Lock()
		n.dpCode = code
		n.mu.Unlock()
		if ctx.Err() == nil {
			fmt.Fprintf(n.s.log, "node %s: dynamig-device-plugin run exited %d: %s\n", n.cfg.Name, code, n.dpOut.String())
		}
	}()
}

// restartDevicePlugin stops the node's device plugin and starts a new one on the same
// GPUs, then waits until it has registered with the kubelet stand-in again and the Node
// advertises its devices again (they were unhealthy while no plugin served them).
func (n *node) restartDevicePlugin(ctx context.Context) error {
	n.mu.Lock()
	cancel, done := n.dpCancel, n.dpDone
	n.mu.Unlock()
	cancel()
	<-done
	before := n.kl.Registrations(n.resource)
	n.startDevicePlugin()
	// Polled: kubelet.WaitFor's condition runs under the stand-in's lock, which
	// Registrations takes too.
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return n.kl.Registrations(n.resource) > before, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: the restarted device plugin did not register: %w", n.cfg.Name, err)
	}
	if err := n.kl.WaitForResource(ctx, n.resource, 1); err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return n.devicesPublished(), nil
	})
	if err != nil {
		return fmt.Errorf("node %s: the Node does not advertise the restarted plugin's devices: %w", n.cfg.Name, err)
	}
	return nil
}

// waitReady waits until the device plugin has registered devices with the kubelet
// stand-in, published the inventory and the heartbeat, and the Node advertises the devices.
func (n *node) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-n.dpDone:
			cancel()
		case <-ctx.Done():
		}
	}()
	fail := func(what string, err error) error {
		select {
		case <-n.dpDone:
			n.mu.Lock()
			code := n.dpCode
			n.mu.Unlock()
			return fmt.Errorf("dynamig-device-plugin run exited %d: %s", code, strings.TrimSpace(n.dpOut.String()))
		default:
		}
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	if err := n.kl.WaitForResource(ctx, n.resource, 1); err != nil {
		return fail("the device plugin to register "+n.resource, err)
	}
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		node, err := n.s.admin.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		gpus, err := api.DecodeInventory(node.Annotations[api.NodeInventoryAnnotation])
		if err != nil || len(gpus) != len(n.cfg.GPUs) {
			last = fmt.Sprintf("inventory of %d GPUs (%v)", len(gpus), err)
			return false, nil
		}
		if q, ok := node.Status.Allocatable[v1.ResourceName(n.resource)]; !ok || q.Value() == 0 {
			last = "the Node does not advertise " + n.resource
			return false, nil
		}
		if _, err := n.s.admin.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(ctx, api.HeartbeatLeaseName(n.cfg.Name), metav1.GetOptions{}); err != nil {
			last = "no heartbeat Lease: " + err.Error()
			return false, nil
		}
		var uuids []string
		for _, g := range gpus {
			uuids = append(uuids, g.ID)
		}
		n.mu.Lock()
		n.gpuUUIDs = uuids
		n.mu.Unlock()
		return true, nil
	})
	if err != nil {
		return fail("the inventory, heartbeat and Node allocatable ("+last+")", err)
	}
	return nil
}

// stop stops the pod loop, the device plugin and the kubelet stand-in (the sandbox's
// context is cancelled already) and removes the socket directory.
func (n *node) stop() {
	n.mu.Lock()
	done := n.dpDone
	n.mu.Unlock()
	if done != nil {
		<-done
	}
	n.wg.Wait()
	if n.kl != nil {
		n.kl.Stop()
	}
	if n.socketDir != "" {
		_ = os.RemoveAll(n.socketDir)
	}
}

// publishDevices keeps the Node's capacity and allocatable of the count resource equal to
// the devices the plugin registered with the kubelet stand-in (allocatable: the healthy
// ones), as kubelet's node status does.
func (n *node) publishDevices(ctx context.Context) {
	last := [2]int{-1, -1}
	for ctx.Err() == nil {
		var got [2]int
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := n.kl.WaitForDevices(wctx, n.resource, func(devs []*pluginapi.Device) bool {
			got = countDevices(devs)
			if got == last {
				return false
			}
			n.setPublishing(true)
			return true
		})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// No plugin connected: its devices are unhealthy, or it never registered.
			if got = countDevices(n.kl.Devices(n.resource)); got == last {
				continue
			}
			n.setPublishing(true)
		}
		err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			node, err := n.client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			name := v1.ResourceName(n.resource)
			node.Status.Capacity[name] = *resource.NewQuantity(int64(got[0]), resource.DecimalSI)
			node.Status.Allocatable[name] = *resource.NewQuantity(int64(got[1]), resource.DecimalSI)
			_, err = n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			n.setPublishing(false)
			if ctx.Err() == nil {
				klog.FromContext(ctx).Error(err, "Updating the Node's devices", "node", n.cfg.Name)
				time.Sleep(time.Second)
			}
			continue
		}
		last = got
		n.mu.Lock()
		n.published, n.publishing = got, false
		n.mu.Unlock()
	}
}

func (n *node) setPublishing(on bool) {
	n.mu.Lock()
	n.publishing = on
	n.mu.Unlock()
}

// devicesPublished reports whether the Node advertises what the kubelet stand-in holds now,
// with no update under way: a pod created after it is scheduled against the devices the
// node really has, not against a count from the plugin's restart.
func (n *node) devicesPublished() bool {
	current := countDevices(n.kl.Devices(n.resource))
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.publishing && n.published == current
}

// countDevices is {all, healthy}.
func countDevices(devs []*pluginapi.Device) [2]int {
	out := [2]int{len(devs), 0}
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			out[1]++
		}
	}
	return out
}

func (n *node) processNext() bool {
	key, quit := n.queue.Get()
	if quit {
		return false
	}
	defer n.queue.Done(key)
	if err := n.sync(n.s.ctx, key); err != nil {
		if n.s.ctx.Err() == nil {
			klog.FromContext(n.s.ctx).V(2).Info("Pod sync failed; retrying", "node", n.cfg.Name, "pod", key, "err", err)
			n.queue.AddRateLimited(key)
		}
		return true
	}
	n.queue.Forget(key)
	return true
}

// sync does for one pod what kubelet would: admit it (Allocate for its GPU containers) and
// run it, or fail it with UnexpectedAdmissionError; free its devices when it ends; delete it
// for good once it is marked for deletion.
func (n *node) sync(ctx context.Context, key string) error {
	obj, exists, err := n.store.GetByKey(key)
	if err != nil {
		return err
	}
	n.mu.Lock()
	st := n.pods[key]
	n.mu.Unlock()
	if !exists {
		if st != nil {
			n.kl.Release(st.uid)
			n.forget(key)
		}
		return nil
	}
	p := obj.(*v1.Pod)
	if st != nil && st.uid != p.UID { // a new pod of the same name
		n.kl.Release(st.uid)
		st = nil
	}
	if st == nil {
		st = &podState{uid: p.UID}
		n.mu.Lock()
		n.pods[key] = st
		n.mu.Unlock()
	}
	switch {
	case p.DeletionTimestamp != nil:
		// Its containers are stopped at once: free the devices, then kubelet's final delete.
		n.kl.Release(p.UID)
		err := n.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(p.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
		return nil
	case p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed:
		n.kl.Release(p.UID)
		return nil
	case st.status:
		return nil
	}
	if !st.admitted {
		_, st.admitErr = n.kl.Admit(ctx, p)
		st.admitted = true
		if st.admitErr != nil && ctx.Err() != nil {
			st.admitted = false // interrupted by Stop, not refused
			return st.admitErr
		}
	}
	if st.admitErr != nil {
		msg := st.admitErr.Error()
		err = updatePodStatus(ctx, n.client, p, func(p *v1.Pod) { setFailedAdmission(p, msg) })
	} else {
		err = updatePodStatus(ctx, n.client, p, setRunning)
	}
	if err != nil {
		return err
	}
	st.status = true
	return nil
}

func (n *node) forget(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.pods, key)
}

// finish writes a terminal status for p, as kubelet does when its containers exit.
func (n *node) finish(ctx context.Context, p *v1.Pod, succeeded bool) error {
	return updatePodStatus(ctx, n.client, p, func(p *v1.Pod) { setFinished(p, succeeded) })
}

func setCondition(p *v1.Pod, t v1.PodConditionType, status v1.ConditionStatus, reason string, now metav1.Time) {
	for i := range p.Status.Conditions {
		c := &p.Status.Conditions[i]
		if c.Type == t {
			if c.Status != status {
				c.LastTransitionTime = now
			}
			c.Status, c.Reason = status, reason
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: t, Status: status, Reason: reason, LastTransitionTime: now})
}

// setRunning is the status of an admitted pod whose containers all started.
func setRunning(p *v1.Pod) {
	now := metav1.Now()
	p.Status.Phase = v1.PodRunning
	p.Status.Reason, p.Status.Message = "", ""
	p.Status.HostIP = "127.0.0.1"
	p.Status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
	if p.Status.StartTime == nil {
		p.Status.StartTime = &now
	}
	for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		setCondition(p, t, v1.ConditionTrue, "", now)
	}
	p.Status.InitContainerStatuses = nil
	for _, c := range p.Spec.InitContainers {
		p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: containerID(p, c.Name), Ready: true, Started: ptr.To(false),
			State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{Reason: "Completed", StartedAt: now, FinishedAt: now,
				ContainerID: containerID(p, c.Name)}},
		})
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: containerID(p, c.Name), Ready: true, Started: ptr.To(true),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
}

// setFailedAdmission is kubelet's status for a pod its admission refused.
func setFailedAdmission(p *v1.Pod, msg string) {
	p.Status.Phase = v1.PodFailed
	p.Status.Reason = "UnexpectedAdmissionError"
	p.Status.Message = "Pod was rejected: " + msg
}

// setFinished is the status of a pod whose containers all exited.
func setFinished(p *v1.Pod, succeeded bool) {
	now := metav1.Now()
	phase, reason, code := v1.PodSucceeded, "Completed", int32(0)
	if !succeeded {
		phase, reason, code = v1.PodFailed, "Error", 1
	}
	p.Status.Phase = phase
	for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.ContainersReady, v1.PodReady} {
		setCondition(p, t, v1.ConditionFalse, "PodCompleted", now)
	}
	for i := range p.Status.ContainerStatuses {
		cs := &p.Status.ContainerStatuses[i]
		started := now
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
		cs.Ready, cs.Started = false, ptr.To(false)
		cs.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: code, Reason: reason,
			StartedAt: started, FinishedAt: now, ContainerID: cs.ContainerID}}
	}
}

func containerID(p *v1.Pod, container string) string {
	return "sandbox://" + string(p.UID) + "/" + container
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
