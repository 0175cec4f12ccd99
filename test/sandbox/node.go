package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/cmd/dynamig-device-plugin/app"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/test/freeport"
	"github.com/dynamig/dynamig/test/kubeletnode"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
)

// node is one simulated node: the real kubelet (test/kubeletnode, on a fake CRI runtime
// that resolves CDI devices), its device plugin on simulated GPUs, and the Node the kubelet
// registers.
type node struct {
	s           *Sandbox
	cfg         sandboxconfig.NodeConfig
	dir         string // the node's own directory (kubelet, runtime, device-plugin sockets)
	metricsAddr string
	resource    string // the count resource name (nvidia.com/gpu)

	kubelet *kubeletnode.Node
	// gpus is the node's simulated hardware; it outlives device-plugin restarts, as real
	// GPUs and their MIG instances do.
	gpus         *sim.Sim
	dpKubeconfig string
	dpCancel     context.CancelFunc
	dpDone       chan struct{}
	dpOut        kubeletnode.LogBuffer
	dpCode       int
	kubeletOut   kubeletnode.LogBuffer
	informers    informers.SharedInformerFactory // completeInitContainers'
	// apiLink carries the device plugin's API requests (CutAPI); clock is its node clock.
	apiLink *apiLink
	clock   skewedClock
	// killed: the last device plugin was killed, and may still hold its metrics port.
	killed bool

	mu       sync.Mutex
	gpuUUIDs []string
}

func (s *Sandbox) newNode(cfg sandboxconfig.NodeConfig) (*node, error) {
	n := &node{s: s, cfg: cfg, resource: s.devCfg.Nvidia.ResourceCountName}
	var err error
	// A short path: unix socket paths are limited to 108 bytes.
	if n.dir, err = os.MkdirTemp("", "dn"); err != nil {
		return n, err
	}
	port, err := freeport.Port()
	if err != nil {
		return n, err
	}
	n.metricsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	specs := make([]sim.GPUSpec, len(cfg.GPUs))
	for i, g := range cfg.GPUs {
		specs[i] = sim.GPUSpec{Model: g, NUMANode: cfg.NUMANode(i)}
	}
	sim.SetMIGModeFor(specs, cfg.Mode)
	if n.gpus, err = sim.New(sim.Options{Seed: cfg.Name, CreateLatency: s.createLatency}, specs...); err != nil {
		return n, err
	}
	return n, n.gpus.Init()
}

// cudaImageEnv is what NVIDIA's CUDA images set in their config (ENV NVIDIA_VISIBLE_DEVICES
// all), which a container of one gets unless something replaces it.
func cudaImageEnv(image string) []string {
	if strings.HasPrefix(image, "nvcr.io/nvidia/cuda:") || strings.HasPrefix(image, "nvidia/cuda:") || strings.HasPrefix(image, "docker.io/nvidia/cuda:") {
		return []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}
	}
	return nil
}

func (n *node) info() NodeInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	return NodeInfo{Name: n.cfg.Name, DeviceMetrics: n.metricsURL(), Mode: n.cfg.Mode,
		GPUs: append([]string(nil), n.cfg.GPUs...), GPUUUIDs: append([]string(nil), n.gpuUUIDs...)}
}

func (n *node) metricsURL() string { return "http://" + n.metricsAddr + "/metrics" }

// start starts the node's kubelet, waits for it to register the Node, then starts the
// device plugin as the daemonSet's pod on this node, as a DaemonSet's pod runs once its Node
// exists.
func (n *node) start(ctx context.Context, kubelet string, daemonSet *unstructured.Unstructured) error {
	kubeconfig, err := n.s.cp.WriteKubeconfig(nodeUser(n.cfg.Name))
	if err != nil {
		return err
	}
	n.kubelet, err = kubeletnode.Start(ctx, kubeletnode.Options{Kubelet: kubelet, Kubeconfig: kubeconfig, NodeName: n.cfg.Name,
		Dir: filepath.Join(n.dir, "k"), Log: io.MultiWriter(&n.kubeletOut, n.s.log),
		Runtime: kubeletnode.RuntimeOptions{IgnoreCDI: n.cfg.RuntimeIgnoresCDI, ImageEnv: cudaImageEnv}})
	if err != nil {
		return err
	}
	restarted := false
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, err := n.kubelet.Exited(); exited {
			// Seen once in a full make test, with two packages' sandboxes starting kubelets at
			// once: the PodResources listener's rename in its own directory failed with
			// EXDEV and the kubelet exited. A second start goes through.
			if !restarted && strings.Contains(n.kubeletOut.String(), "invalid cross-device link") {
				restarted = true
				fmt.Fprintf(n.s.log, "node %s: the kubelet exited at start (%v); starting it again\n", n.cfg.Name, err)
				return false, n.kubelet.RestartKubelet()
			}
			return false, fmt.Errorf("the kubelet exited (%v): %s", err, tail(n.kubeletOut.String(), 4000))
		}
		_, err := n.s.admin.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the kubelet to register the Node: %w", err)
	}
	// Label the node as an operator does for the DaemonSet (HAMi's gpu=on): the kubelet admits
	// only pods whose node selector its Node matches.
	selector, _, _ := unstructured.NestedStringMap(daemonSet.Object, "spec", "template", "spec", "nodeSelector")
	if len(selector) > 0 {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": selector}})
		if _, err := n.s.admin.CoreV1().Nodes().Patch(ctx, n.cfg.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("labelling the Node for the device plugin's DaemonSet: %w", err)
		}
	}
	if n.s.controllers {
		n.dpKubeconfig, err = n.s.daemonPodIdentity(ctx, daemonSet, n.cfg.Name)
	} else {
		n.dpKubeconfig, err = n.s.identity(ctx, daemonSet, n.cfg.Name, devicePluginPaths(n))
	}
	if err != nil {
		return err
	}
	api, err := url.Parse(n.s.cp.Config.Host)
	if err != nil {
		return err
	}
	if n.apiLink, err = newAPILink(api.Host); err != nil {
		return err
	}
	if err := viaLink(n.dpKubeconfig, n.apiLink); err != nil {
		return err
	}
	if err := n.startDevicePlugin(); err != nil {
		return err
	}
	return n.completeInitContainers()
}

// completeInitContainers ends every plain init container of the node's pods with exit code
// 0 once it runs, as a short setup step does, so pods get to their app containers. App
// containers and sidecars (init containers with restartPolicy Always) run until the pod is
// deleted or FinishPod ends them.
func (n *node) completeInitContainers() error {
	factory := informers.NewSharedInformerFactoryWithOptions(n.s.admin, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.cfg.Name).String()
	}))
	complete := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return
		}
		for _, st := range p.Status.InitContainerStatuses {
			if st.State.Running == nil {
				continue
			}
			for _, c := range p.Spec.InitContainers {
				if c.Name == st.Name && (c.RestartPolicy == nil || *c.RestartPolicy != v1.ContainerRestartPolicyAlways) {
					_ = n.kubelet.Runtime.Exit(p.UID, c.Name, 0)
				}
			}
		}
	}
	_, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: complete, UpdateFunc: func(_, obj any) { complete(obj) },
	})
	if err != nil {
		return err
	}
	factory.Start(n.s.ctx.Done())
	n.informers = factory
	return nil
}

// startDevicePlugin runs `dynamig-device-plugin run` in-process on the node's simulated
// GPUs until the sandbox stops or the plugin is restarted or killed. After a kill it serves
// its metrics on a new port: the killed one may hold its own until it ends.
func (n *node) startDevicePlugin() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.killed {
		port, err := freeport.Port()
		if err != nil {
			return err
		}
		n.metricsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		n.killed = false
	}
	args := []string{"run", "--nvml=sim", "--sim-gpus=" + strings.Join(n.cfg.GPUs, ","), "--node-name=" + n.cfg.Name,
		"--kubeconfig=" + n.dpKubeconfig, "--kubelet-socket-dir=" + n.kubelet.DevicePluginDir, "--metrics-bind-address=" + n.metricsAddr,
		"--pod-resources-socket=" + n.kubelet.PodResourcesSocket, "--cdi-spec-dir=" + n.kubelet.CDIDir,
		"--runtime-endpoints=unix://" + n.kubelet.RuntimeSocket,
		"--config=" + n.s.deviceConfig}
	ctx, cancel := context.WithCancel(n.s.ctx)
	done := make(chan struct{})
	n.dpCancel, n.dpDone = cancel, done
	go func() {
		defer close(done)
		out := io.MultiWriter(&n.dpOut, n.s.log)
		code := app.MainContext(ctx, args, out, out, app.WithNVML(n.gpus), app.WithClock(&n.clock))
		n.mu.Lock()
		n.dpCode = code
		n.mu.Unlock()
		if ctx.Err() == nil {
			fmt.Fprintf(n.s.log, "node %s: dynamig-device-plugin run exited %d: %s\n", n.cfg.Name, code, n.dpOut.String())
		}
	}()
	return nil
}

// killDevicePlugin cancels the device plugin without waiting for it (KillDevicePlugin).
func (n *node) killDevicePlugin() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dpCancel()
	n.dpDone = nil
	n.killed = true
}

// restartDevicePlugin stops the node's device plugin and starts a new one on the same
// GPUs, then waits until the Node advertises its devices again: the kubelet marks them
// unhealthy while no plugin serves them, and a pod created before they are back would be
// scheduled against none.
func (n *node) restartDevicePlugin(ctx context.Context) error {
	n.mu.Lock()
	cancel, done := n.dpCancel, n.dpDone
	n.mu.Unlock()
	cancel()
	if done != nil {
		<-done
	}
	if err := n.waitAllocatable(ctx, func(q int64) bool { return q == 0 }); err != nil {
		return fmt.Errorf("node %s: the kubelet did not see the device plugin go: %w", n.cfg.Name, err)
	}
	if err := n.startDevicePlugin(); err != nil {
		return err
	}
	if err := n.waitAllocatable(ctx, func(q int64) bool { return q > 0 }); err != nil {
		return fmt.Errorf("node %s: the Node does not advertise the restarted plugin's devices: %w", n.cfg.Name, err)
	}
	return nil
}

// restartKubelet restarts the kubelet and waits for the Node to be Ready with the devices
// advertised again. The kubelet's start time moves: Ready is awaited after it.
func (n *node) restartKubelet(ctx context.Context) error {
	restarted := time.Now()
	if err := n.kubelet.RestartKubelet(); err != nil {
		return err
	}
	return n.waitReadySince(ctx, restarted)
}

// waitReadySince waits for the Node to be Ready by a heartbeat after since, with the
// device plugin's devices advertised.
func (n *node) waitReadySince(ctx context.Context, since time.Time) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if exited, err := n.kubelet.Exited(); exited {
			return false, fmt.Errorf("the kubelet exited (%v): %s", err, tail(n.kubeletOut.String(), 4000))
		}
		node, err := n.s.admin.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q := node.Status.Allocatable[v1.ResourceName(n.resource)]
		ready, _ := kubeletnode.Ready(node, since)
		return ready && q.Value() > 0, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: not Ready with its devices after the kubelet started: %w", n.cfg.Name, err)
	}
	return nil
}

// reboot is RebootNode.
func (n *node) reboot(ctx context.Context) error {
	n.mu.Lock()
	cancel, done := n.dpCancel, n.dpDone
	n.mu.Unlock()
	cancel()
	if done != nil {
		<-done
	}
	n.kubelet.StopKubelet()
	for _, g := range n.gpus.Snapshot() {
		for _, gi := range g.GpuInstances {
			if err := n.gpus.LoseGpuInstance(g.Index, gi.ID); err != nil {
				return err
			}
		}
	}
	specs, err := os.ReadDir(n.kubelet.CDIDir)
	if err != nil {
		return err
	}
	for _, f := range specs {
		if err := os.RemoveAll(filepath.Join(n.kubelet.CDIDir, f.Name())); err != nil {
			return err
		}
	}
	n.kubelet.Runtime.Reboot()
	restarted := time.Now()
	if err := n.kubelet.RestartKubelet(); err != nil {
		return err
	}
	if err := n.startDevicePlugin(); err != nil {
		return err
	}
	return n.waitReadySince(ctx, restarted)
}

// waitAllocatable waits until the Node's allocatable count of the resource satisfies ok.
func (n *node) waitAllocatable(ctx context.Context, ok func(int64) bool) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		node, err := n.s.admin.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q := node.Status.Allocatable[v1.ResourceName(n.resource)]
		return ok(q.Value()), nil
	})
}

// waitReady waits until the Node is Ready and advertises the device plugin's devices, and
// the plugin has published its inventory and heartbeat.
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
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, err := n.kubelet.Exited(); exited {
			return false, fmt.Errorf("the kubelet exited (%v): %s", err, tail(n.kubeletOut.String(), 4000))
		}
		node, err := n.s.admin.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if ready, why := kubeletnode.Ready(node, time.Time{}); !ready {
			last = "the Node is not Ready (" + why + ")"
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
		select {
		case <-n.dpDone:
			n.mu.Lock()
			code := n.dpCode
			n.mu.Unlock()
			return fmt.Errorf("dynamig-device-plugin run exited %d: %s", code, strings.TrimSpace(n.dpOut.String()))
		default:
		}
		return fmt.Errorf("waiting for the Node (%s): %w", last, err)
	}
	return nil
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// stop stops the device plugin and the kubelet (the sandbox's context is cancelled already)
// and removes the node's directory.
func (n *node) stop() {
	n.mu.Lock()
	done := n.dpDone
	n.mu.Unlock()
	if done != nil {
		<-done
	}
	if n.informers != nil {
		n.informers.Shutdown()
	}
	if n.apiLink != nil {
		n.apiLink.close()
	}
	if n.kubelet != nil {
		n.kubelet.Stop()
	}
	if n.dir != "" {
		_ = os.RemoveAll(n.dir)
	}
}

// finish ends the pod's running containers with exit code 0 (succeeded) or 1, as its
// processes exiting would; the kubelet then writes the pod's status.
func (n *node) finish(p *v1.Pod, succeeded bool) error {
	code := int32(1)
	if succeeded {
		code = 0
	}
	ended := 0
	for _, c := range p.Spec.Containers {
		if err := n.kubelet.Runtime.Exit(p.UID, c.Name, code); err == nil {
			ended++
		}
	}
	if ended == 0 {
		return fmt.Errorf("pod %s/%s has no running container on node %s", p.Namespace, p.Name, n.cfg.Name)
	}
	return nil
}
