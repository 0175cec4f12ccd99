package throughput

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/inventory"
	"github.com/dynamig/dynamig/nvml/sim"
)

// GPUModel is the simulated GPU every benchmark node carries, GPUsPerNode of them.
const (
	GPUModel    = "NVIDIA A100-PCIE-40GB"
	GPUsPerNode = 8
)

// heartbeatDuration is the heartbeat Leases' leaseDurationSeconds: they are created fresh
// with each node and stay fresh for the whole run, so no renewals compete with the
// measured traffic.
const heartbeatDuration = 6 * 3600

// nodeTemplate is the inventory annotation of one node, computed once by the device
// plugin's inventory code over simulated GPUs; each node gets a copy with its own UUIDs.
type nodeTemplate struct {
	raw   string
	uuids []string // the template's GPU UUIDs, replaced per node
	count int      // nvidia.com/gpu: the sum of the GPUs' device counts
}

const templateNode = "throughput-template"

func newNodeTemplate() (*nodeTemplate, error) {
	cfg, err := config.ParseDeviceConfig([]byte(fmt.Sprintf("nodeconfig:\n- name: %s\n  operatingmode: %s\n", templateNode, api.ModeMIG)))
	if err != nil {
		return nil, err
	}
	specs := make([]sim.GPUSpec, GPUsPerNode)
	for i := range specs {
		specs[i] = sim.GPUSpec{Model: GPUModel}
	}
	s, err := sim.New(sim.Options{Seed: templateNode}, specs...)
	if err != nil {
		return nil, err
	}
	if err := s.Init(); err != nil {
		return nil, err
	}
	res, err := inventory.Discover(context.Background(), s, cfg, templateNode)
	if err != nil {
		return nil, err
	}
	raw, err := api.EncodeInventory(res.GPUs)
	if err != nil {
		return nil, err
	}
	t := &nodeTemplate{raw: raw}
	for _, g := range res.GPUs {
		if g.ID == "" || !strings.Contains(raw, g.ID) {
			return nil, fmt.Errorf("GPU %d has no UUID in the inventory", g.Index)
		}
		t.uuids = append(t.uuids, g.ID)
		t.count += g.Count
	}
	return t, nil
}

// inventoryFor is the template's annotation with UUIDs unique to node number n: the last
// 12 hex digits of each UUID are replaced by the node and GPU numbers.
func (t *nodeTemplate) inventoryFor(n int) string {
	pairs := make([]string, 0, 2*len(t.uuids))
	for i, u := range t.uuids {
		pairs = append(pairs, u, t.uuidFor(n, i))
	}
	return strings.NewReplacer(pairs...).Replace(t.raw)
}

// uuidFor is the UUID of GPU i of node number n.
func (t *nodeTemplate) uuidFor(n, i int) string {
	u := t.uuids[i]
	if len(u) > 12 {
		return u[:len(u)-12] + fmt.Sprintf("%08x%04x", n, i)
	}
	return fmt.Sprintf("%s-%d", u, n)
}

func nodeName(n int) string { return fmt.Sprintf("tp-node-%05d", n) }

// addNodes registers nodes [from, to): each a Ready node with the template's inventory,
// allocatable cpu/memory/pods and nvidia.com/gpu, and a fresh heartbeat Lease (written as
// the device plugin), with a few requests in flight.
func addNodes(ctx context.Context, admin, dp kubernetes.Interface, t *nodeTemplate, from, to int) error {
	resources := v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("32"), v1.ResourceMemory: resource.MustParse("256Gi"), v1.ResourcePods: resource.MustParse("110"),
		api.ResourceCount: *resource.NewQuantity(int64(t.count), resource.DecimalSI),
	}
	one := func(n int) error {
		name := nodeName(n)
		now := metav1.Now()
		node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name},
			Annotations: map[string]string{api.NodeInventoryAnnotation: t.inventoryFor(n)}}}
		created, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", name, err)
		}
		created.Status = v1.NodeStatus{Capacity: resources, Allocatable: resources,
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: now, LastTransitionTime: now}}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node %s status: %w", name, err)
		}
		mnow := metav1.NewMicroTime(time.Now())
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeaseName(name), Namespace: api.DefaultSystemNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](heartbeatDuration),
				AcquireTime: &mnow, RenewTime: &mnow},
		}
		if _, err := dp.CoordinationV1().Leases(api.DefaultSystemNamespace).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("heartbeat of %s: %w", name, err)
		}
		return nil
	}
	return parallel(8, to-from, func(i int) error { return one(from + i) })
}

func cpuNodeName(n int) string { return fmt.Sprintf("tp-cpu-%05d", n) }

// addCPUNodes registers n CPU nodes: Ready, the GPU nodes' cpu, memory and pods, no
// inventory, no nvidia.com/gpu, no heartbeat.
func addCPUNodes(ctx context.Context, admin kubernetes.Interface, n int) error {
	resources := v1.ResourceList{v1.ResourceCPU: resource.MustParse("32"), v1.ResourceMemory: resource.MustParse("256Gi"), v1.ResourcePods: resource.MustParse("110")}
	return parallel(8, n, func(i int) error {
		name := cpuNodeName(i)
		now := metav1.Now()
		created, err := admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", name, err)
		}
		created.Status = v1.NodeStatus{Capacity: resources, Allocatable: resources,
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node %s status: %w", name, err)
		}
		return nil
	})
}

// renameProfile is a configuration edit that names the (one) profile schedulerName.
func renameProfile(schedulerName string) func(doc map[string]any) error {
	return func(doc map[string]any) error {
		profiles, _ := doc["profiles"].([]any)
		if len(profiles) != 1 {
			return fmt.Errorf("%d profiles, want one", len(profiles))
		}
		prof, ok := profiles[0].(map[string]any)
		if !ok {
			return fmt.Errorf("profile is %T", profiles[0])
		}
		prof["schedulerName"] = schedulerName
		return nil
	}
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(workers, n int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n)) // stop the others
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// Profile is which scheduler configuration a scenario runs.
type Profile int

const (
	// DefaultPlugins is the shipped configuration without its plugins section (so
	// kube-scheduler's default plugins, NodeResourcesFit's score included, and DefaultBinder)
	// and with the pluginConfig of DynamicMIG and of the plugins the profile configures for
	// batching dropped (defaultOnlyDropped): kube-scheduler's default profile, as CPU pods get
	// it on a cluster, but for NodeResourcesFit's ignoredResources.
	DefaultPlugins Profile = iota
	// WithDynamicMIG is the shipped configuration.
	WithDynamicMIG
	// Extender is DefaultPlugins with the allocator behind an HTTP scheduler extender
	// (HAMi's architecture; see extender).
	Extender
	// NoScheduler runs no scheduler: the harness's binder binds each pod (see binder).
	NoScheduler
)

// defaultOnlyDropped are the pluginConfig entries DefaultPlugins drops: DynamicMIG's, and
// PodTopologySpread's and InterPodAffinity's, which the shipped profile sets so that pods can
// be batched (kube-scheduler's defaults: system default spreading, which signs no pod).
var defaultOnlyDropped = []any{"DynamicMIG", "PodTopologySpread", "InterPodAffinity"}

// configEdit edits the shipped KubeSchedulerConfiguration for profile, with
// clientConnection qps and burst set and, when nodesToScore > 0, percentageOfNodesToScore
// (cluster.ControlPlane.SchedulerConfig applies it and completes the copy with the kubeconfig).
func configEdit(profile Profile, qps float64, burst int, nodesToScore int, extenderURL string) func(doc map[string]any) error {
	return func(doc map[string]any) error { return editConfig(doc, profile, qps, burst, nodesToScore, extenderURL) }
}

func editConfig(doc map[string]any, profile Profile, qps float64, burst int, nodesToScore int, extenderURL string) error {
	cc, ok := doc["clientConnection"].(map[string]any)
	if !ok {
		cc = map[string]any{}
		doc["clientConnection"] = cc
	}
	cc["qps"], cc["burst"] = qps, burst
	if nodesToScore > 0 {
		doc["percentageOfNodesToScore"] = nodesToScore
	}
	if profile == Extender {
		doc["extenders"] = []any{map[string]any{
			"urlPrefix": extenderURL, "filterVerb": "filter", "bindVerb": "bind", "nodeCacheCapable": true,
			"httpTimeout": "5m", "managedResources": []any{map[string]any{"name": api.ResourceCount, "ignoredByScheduler": false}},
		}}
	}
	if profile == DefaultPlugins || profile == Extender {
		profiles, _ := doc["profiles"].([]any)
		if len(profiles) == 0 {
			return errors.New("no profiles")
		}
		for _, p := range profiles {
			prof, ok := p.(map[string]any)
			if !ok {
				return fmt.Errorf("profile is %T", p)
			}
			// kube-scheduler's default plugins at every extension point: NodeResourcesFit
			// scores too, DefaultBinder binds.
			delete(prof, "plugins")
			if pcs, ok := prof["pluginConfig"].([]any); ok {
				var keep []any
				for _, pc := range pcs {
					if m, ok := pc.(map[string]any); ok && slices.Contains(defaultOnlyDropped, m["name"]) {
						continue
					}
					keep = append(keep, pc)
				}
				prof["pluginConfig"] = keep
			}
		}
	}
	return nil
}
