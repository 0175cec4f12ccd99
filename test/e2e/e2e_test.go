// Package e2e runs dynamig's end-to-end suites on the in-process sandbox cluster: the real
// kube-apiserver with the shipped admission policies, the real dynamig-scheduler, and per
// node the real kubelet (on a fake CRI runtime that resolves CDI devices) with the real
// device plugin on simulated GPUs. Each suite asserts on API objects, on what each
// container's resolved CDI environment holds, and on the simulated NVML state.
package e2e

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/manifests"
	"github.com/dynamig/dynamig/signing"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/sandbox"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
	"github.com/dynamig/dynamig/test/sandbox/sandboxtest"
)

const (
	install  = "../../manifests/install.yaml"
	examples = "../../examples"
)

// kubectlDynamigBinary is kubectl-dynamig, built by TestMain: the tests run it as a user
// does. (It cannot be linked into this test binary: cli-runtime brings kustomize, which
// imports Go's plugin package, and a binary that does is bound at load time, which go-nvml's
// deliberately unresolved NVML symbols, linked here through the device plugin, cannot be.)
var kubectlDynamigBinary string

func TestMain(m *testing.M) {
	// The binary as shipped, when given (`make test-minor` passes the one built on the newest
	// minor to every other minor's suite); else built here.
	kubectlDynamigBinary = os.Getenv("DYNAMIG_KUBECTL_DYNAMIG")
	sandboxtest.Main(m, map[string]*string{"github.com/dynamig/dynamig/cmd/kubectl-dynamig": &kubectlDynamigBinary})
}

// world is one suite's sandbox.
type world struct{ sandboxtest.World }

func start(t *testing.T, nodes ...sandboxconfig.NodeConfig) *world {
	t.Helper()
	return startWith(t, install, nodes...)
}

// startWith starts a sandbox that installs the manifest at installFile.
func startWith(t *testing.T, installFile string, nodes ...sandboxconfig.NodeConfig) *world {
	t.Helper()
	cfg := sandboxconfig.DefaultConfig()
	if len(nodes) > 0 {
		cfg = sandboxconfig.Config{Nodes: nodes}
	}
	return startSandbox(t, installFile, cfg)
}

// startConfig starts a sandbox of cfg installed from manifests/install.yaml.
func startConfig(t *testing.T, cfg sandboxconfig.Config) *world {
	t.Helper()
	return startSandbox(t, install, cfg)
}

func startSandbox(t *testing.T, installFile string, cfg sandboxconfig.Config) *world {
	t.Helper()
	return &world{sandboxtest.Start(t, sandbox.Options{Config: cfg, Install: installFile}, 2*time.Minute)}
}

func mig(name string, gpus ...string) sandboxconfig.NodeConfig {
	return sandboxconfig.NodeConfig{Name: name, Mode: api.ModeMIG, GPUs: gpus}
}

// pod is a GPU pod for dynamig-scheduler (sandboxtest.GPUPod).
var pod = sandboxtest.GPUPod

// TestSeedExample runs the seed's example pods, unchanged, on the sandbox installed from
// manifests/install.yaml, from the chart rendered with its defaults, and from the chart
// rendered with a HAMi v2.10 values file (whose schedulerName, hami-scheduler, the webhook,
// the policies and the scheduler's profile then all use): every object applied with
// server-side apply, every component under the identity and rights the manifest gives it.
func TestSeedExample(t *testing.T) {
	hamiValues, err := os.ReadFile("../../manifests/testdata/hami-v2.10-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	hami, err := manifests.ReadValues(hamiValues)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, scheduler string
		values          map[string]any // nil: manifests/install.yaml as it is
	}{
		{"install.yaml", api.DefaultSchedulerName, nil},
		{"chart defaults", api.DefaultSchedulerName, map[string]any{}},
		{"chart with HAMi v2.10 values", "hami-scheduler", hami},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := install
			if tc.values != nil {
				rendered, err := manifests.Render(manifests.Namespace, tc.values)
				if err != nil {
					t.Fatal(err)
				}
				file = filepath.Join(t.TempDir(), "rendered.yaml")
				if err := os.WriteFile(file, rendered, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			seedExample(t, startWith(t, file), tc.scheduler)
		})
	}
}

func seedExample(t *testing.T, w *world, scheduler string) {
	for _, f := range []string{"gpu-pod1.yaml", "mig-workload.yaml"} {
		data, err := os.ReadFile(examples + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		pods, err := cluster.DecodePods(data)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if p.Namespace == "" {
				p.Namespace = "default"
			}
		}
		w.Create(pods...)
	}
	recs := w.Running("gpu-pod1", "mig-workload")
	if len(recs["gpu-pod1"]) != 2 || len(recs["mig-workload"]) != 1 {
		t.Fatalf("reservations: %v", recs)
	}
	for _, name := range []string{"gpu-pod1", "mig-workload"} {
		if got := w.Get(name).Spec.SchedulerName; got != scheduler {
			t.Errorf("%s: schedulerName %q, want the webhook's %q", name, got, scheduler)
		}
	}
	for _, rs := range recs {
		for _, r := range rs {
			if r.Profile != "2g.10gb" {
				t.Errorf("profile %s, want 2g.10gb", r.Profile)
			}
		}
	}
	sandboxtest.NoOverlap(t, recs)
	w.SameHardware("mig-node", recs)
	// Each container sees its own MIG devices, and nothing else.
	w.seesOwnDevices("gpu-pod1", "ubuntu-container1", recs["gpu-pod1"])
	w.seesOwnDevices("mig-workload", "workload", recs["mig-workload"])
	w.realisedEvents(recs)
	w.componentsAsServiceAccounts()
	w.checkKubectlDynamig(recs)
}

// kubectlDynamig: `kubectl dynamig nodes` shows the seed layout (two 2g.10gb of gpu-pod1 at
// [0,2) and [2,4), mig-workload's at [4,6), [6,8) free) and `pods -A` the pods realised
// with their MIG UUIDs.
func (w *world) checkKubectlDynamig(recs map[string][]api.MigReservation) {
	run := w.kubectlDynamig
	nodes := run("nodes", "mig-node")
	for _, want := range []string{"mig-node  heartbeat fresh", "|a a b b c c . .|", "[0,2)  2g.10gb  default/gpu-pod1", "[2,4)  2g.10gb  default/gpu-pod1",
		"[4,6)  2g.10gb  default/mig-workload", "[6,8)  free", "room   1g.5gb 1 at [6,7)"} {
		if !strings.Contains(nodes, want) {
			w.T.Errorf("kubectl dynamig nodes lacks %q:\n%s", want, nodes)
		}
	}
	pods := run("pods", "-A", "-o", "wide")
	for name, rs := range recs {
		for _, r := range rs {
			if !strings.Contains(pods, r.MigUUID) || !strings.Contains(pods, name) {
				w.T.Errorf("kubectl dynamig pods -A lacks %s's %s:\n%s", name, r.MigUUID, pods)
			}
		}
	}
	if !strings.Contains(pods, "realised") {
		w.T.Errorf("kubectl dynamig pods -A:\n%s", pods)
	}
	// Both sandbox nodes have an A100-40GB: models says so.
	if models := run("models"); !regexp.MustCompile(`(?m)^A100-40GB +NVIDIA A100-SXM4-40GB +2 on 2 nodes `).MatchString(models) {
		w.T.Errorf("kubectl dynamig models does not count the cluster's two A100-40GB:\n%s", models)
	}
	// A 3g.20gb MIG pod cannot fit beside the three 2g.10gb: explain says so per node.
	big := pod("too-big", api.ModeMIG, 1, 19000)
	big.Spec.SchedulerName = "" // the webhook names the installed scheduler
	w.Create(big)
	explain := run("explain", "too-big", "-n", "default")
	for _, want := range []string{"mig-node    no     all MIG placements taken", "every placement of 3g.20gb is taken", "core-node   no"} {
		if !strings.Contains(explain, want) {
			w.T.Errorf("kubectl dynamig explain lacks %q:\n%s", want, explain)
		}
	}
}

// kubectlDynamig runs bin/kubectl-dynamig against the sandbox and returns its stdout.
func (w *world) kubectlDynamig(args ...string) string {
	w.T.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(w.Ctx, kubectlDynamigBinary, append([]string{"--kubeconfig", w.SB.Kubeconfig()}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		w.T.Fatalf("kubectl dynamig %v: %v: %s", args, err, errOut.String())
	}
	return out.String()
}

// componentsAsServiceAccounts: at the API server, every write of the scheduler and the device
// plugins came with a token bound to a pod of their workload (its name in the user's extra),
// and a device plugin's with its node, the node of what it wrote.
func (w *world) componentsAsServiceAccounts() {
	const podKey, nodeKey = "authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/node-name"
	events, err := w.SB.ControlPlane().AuditEvents()
	if err != nil {
		w.T.Fatal(err)
	}
	seen := map[string]int{}
	for _, ev := range events {
		user := ev.User.Username
		if user != "system:serviceaccount:dynamig-system:dynamig-scheduler" && user != "system:serviceaccount:dynamig-system:dynamig-device-plugin" {
			continue
		}
		seen[user]++
		pod, node := ev.User.Extra[podKey], ev.User.Extra[nodeKey]
		if len(pod) != 1 {
			w.T.Errorf("%s wrote %s %v without a pod-bound token (extra %v)", user, ev.Verb, ev.ObjectRef, ev.User.Extra)
			continue
		}
		if strings.HasSuffix(user, "dynamig-device-plugin") {
			if len(node) != 1 || pod[0] != "dynamig-device-plugin-"+node[0] {
				w.T.Errorf("device plugin write %s %v: pod %v, node %v", ev.Verb, ev.ObjectRef, pod, node)
			}
			if r := ev.ObjectRef; r != nil && r.Resource == "nodes" && len(node) == 1 && r.Name != node[0] {
				w.T.Errorf("the device plugin of %s wrote Node %s", node[0], r.Name)
			}
		}
	}
	if seen["system:serviceaccount:dynamig-system:dynamig-scheduler"] == 0 || seen["system:serviceaccount:dynamig-system:dynamig-device-plugin"] == 0 {
		w.T.Errorf("writes per component at the API server: %v", seen)
	}
}

func (w *world) seesOwnDevices(podName, container string, recs []api.MigReservation) {
	w.T.Helper()
	env, err := w.SB.ContainerEnv(w.Ctx, "default", podName, container)
	if err != nil {
		w.T.Fatal(err)
	}
	p := w.Get(podName)
	all := append(append([]v1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
	var want []string
	for _, r := range recs {
		if r.ContainerIndex < len(all) && all[r.ContainerIndex].Name == container {
			want = append(want, r.MigUUID)
		}
	}
	if got := env["NVIDIA_VISIBLE_DEVICES"]; got != strings.Join(want, ",") || len(want) == 0 {
		w.T.Errorf("%s/%s sees NVIDIA_VISIBLE_DEVICES=%q, want its own %q", podName, container, got, strings.Join(want, ","))
	}
}

// TestSidecarWithGPU: a sidecar (an init container with restartPolicy Always) and the main
// container each get a MIG instance of their own, and each sees only its own.
func TestSidecarWithGPU(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	p := pod("with-sidecar", "mig", 1, 4000)
	sidecar := p.Spec.Containers[0]
	sidecar.Name, sidecar.RestartPolicy = "sidecar", ptr.To(v1.ContainerRestartPolicyAlways)
	p.Spec.InitContainers = []v1.Container{sidecar}
	w.Create(p)
	recs := w.Running("with-sidecar")
	if len(recs["with-sidecar"]) != 2 {
		t.Fatalf("reservations %v, want one for the sidecar and one for main", recs)
	}
	sandboxtest.NoOverlap(t, recs)
	w.SameHardware("n", recs)
	w.seesOwnDevices("with-sidecar", "sidecar", recs["with-sidecar"])
	w.seesOwnDevices("with-sidecar", "main", recs["with-sidecar"])
}

func TestMixedProfilesOnOneGPU(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	w.Create(pod("small", "mig", 1, 4000), pod("medium", "mig", 1, 9000), pod("large", "mig", 1, 19000))
	recs := w.Running("small", "medium", "large")
	want := map[string]string{"small": "1g.5gb", "medium": "2g.10gb", "large": "3g.20gb"}
	for name, profile := range want {
		if len(recs[name]) != 1 || recs[name][0].Profile != profile {
			t.Errorf("%s: %v, want %s", name, recs[name], profile)
		}
	}
	sandboxtest.NoOverlap(t, recs)
	w.SameHardware("n", recs)
	for name := range want {
		w.seesOwnDevices(name, "main", recs[name])
	}
}

func TestExhaustionThenReclaim(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	w.Create(pod("a", "mig", 1, 19000), pod("b", "mig", 1, 19000))
	recs := w.Running("a", "b")
	w.Create(pod("c", "mig", 1, 4000))
	if msg := w.Pending("c"); !strings.Contains(msg, "all MIG placements taken") {
		t.Errorf("c's reason: %q", msg)
	}
	w.Delete("b")
	w.Gone("n", "b")
	got := w.Running("c")
	freed := recs["b"][0].Placement
	if p := got["c"][0].Placement; p.Start < freed.Start || p.End() > freed.End() {
		t.Errorf("c at %s, want inside b's freed %s", p, freed)
	}
	w.SameHardware("n", map[string][]api.MigReservation{"a": recs["a"], "c": got["c"]})
	w.seesOwnDevices("a", "main", recs["a"])
	w.seesOwnDevices("c", "main", got["c"])
}

func TestSmallestProfileAcrossModels(t *testing.T) {
	cases := []struct{ node, model, profile string }{
		{"a30", "A30-24GB", "2g.12gb"},
		{"a100-80", "A100-80GB", "1g.10gb"},
		{"h100", "H100-80GB", "1g.10gb"},
		{"h200", "NVIDIA H200", "1g.18gb"},
		{"b200", "B200-180GB", "1g.23gb"},
		{"rtx", "RTX-PRO-6000-Blackwell-Server", "1g.24gb"},
	}
	var nodes []sandboxconfig.NodeConfig
	for _, c := range cases {
		nodes = append(nodes, mig(c.node, c.model))
	}
	w := start(t, nodes...)
	uuids := map[string]string{}
	for _, n := range w.SB.Nodes() {
		uuids[n.Name] = n.GPUUUIDs[0]
	}
	var names []string
	for _, c := range cases {
		w.Create(pod("p-"+c.node, "mig", 1, 8000, api.UseGPUUUIDAnnotation, uuids[c.node]))
		names = append(names, "p-"+c.node)
	}
	recs := w.Running(names...)
	for _, c := range cases {
		r := recs["p-"+c.node]
		if len(r) != 1 || r[0].Profile != c.profile || r[0].GPUUUID != uuids[c.node] {
			t.Errorf("%s (%s): %v, want %s", c.node, c.model, r, c.profile)
		}
		w.SameHardware(c.node, map[string][]api.MigReservation{"p-" + c.node: r})
		w.seesOwnDevices("p-"+c.node, "main", r)
	}
}

// TestHAMiUsersPods: pods written as a HAMi user writes them, naming no scheduler and no
// nvidia.com/gpu, run: the webhook gives each container defaultGPUNum (1) devices, in its
// limits and requests, and the pod dynamig-scheduler. One asks for 8000 MiB (HAMi's profile:
// the smallest allowlisted one with the memory, a 2g.10gb), one for 50 % of the GPU (half of
// it: a 20 GB profile, the 3g.20gb of HAMi's default allowlist, not the 7g.40gb that 50 % of
// its MiB would take).
func TestHAMiUsersPods(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	asHAMiUser := func(name string, r v1.ResourceName, v int64) *v1.Pod {
		p := pod(name, "", 1, 0)
		p.Spec.SchedulerName = ""
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{r: *resource.NewQuantity(v, resource.DecimalSI)}
		return p
	}
	for _, p := range []*v1.Pod{asHAMiUser("gpumem-only", api.ResourceMemory, 8000), asHAMiUser("half", api.ResourceMemoryPercentage, 50)} {
		created, err := w.C.CoreV1().Pods("default").Create(w.Ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		res := created.Spec.Containers[0].Resources
		if created.Spec.SchedulerName != api.DefaultSchedulerName || res.Limits.Name(api.ResourceCount, resource.DecimalSI).Value() != 1 ||
			res.Requests.Name(api.ResourceCount, resource.DecimalSI).Value() != 1 {
			t.Errorf("%s: schedulerName %q, resources %v, want %s and %s: 1 in limits and requests", p.Name, created.Spec.SchedulerName, res, api.DefaultSchedulerName, api.ResourceCount)
		}
	}
	recs := w.Running("gpumem-only", "half")
	for name, want := range map[string]string{"gpumem-only": "2g.10gb", "half": "3g.20gb"} {
		if r := recs[name]; len(r) != 1 || r[0].Profile != want {
			t.Errorf("%s: %v, want one %s", name, r, want)
		}
		w.seesOwnDevices(name, "main", recs[name])
	}
	sandboxtest.NoOverlap(t, recs)
}

// TestNamespaceQuota: a ResourceQuota in HAMi's form (limits.nvidia.com/gpumem) bounds the
// GPU memory a namespace's pods are granted, a MIG device counting its whole profile (8,000
// MiB asked is a 2g.10gb, 9,856 MiB): the pod that would pass it stays Pending with the
// quota's name, use and limit; when a pod ends, exactly one of two pods that each fit the
// freed room alone runs, and the other once another pod ends.
func TestNamespaceQuota(t *testing.T) {
	w := start(t, mig("n", "A100-40GB", "A100-40GB"))
	quota := &v1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: "default"},
		Spec: v1.ResourceQuotaSpec{Hard: v1.ResourceList{"limits." + api.ResourceMemory: resource.MustParse("20000")}}}
	if _, err := w.C.CoreV1().ResourceQuotas("default").Create(w.Ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.Create(pod("a", "mig", 1, 8000), pod("b", "mig", 1, 8000))
	w.Running("a", "b")
	w.Create(pod("c", "mig", 1, 8000))
	want := "ResourceQuota default/gpu limits.nvidia.com/gpumem: 19712 used of 20000, and the pod would be granted 9856"
	if msg := w.Pending("c"); !strings.Contains(msg, want) {
		t.Errorf("c's reason: %q, want it to say %q", msg, want)
	}
	if out := w.kubectlDynamig("quotas"); !slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool {
		return slices.Equal(strings.Fields(l), []string{"default", "gpu", "limits.nvidia.com/gpumem", "19712", "20000"})
	}) {
		t.Errorf("kubectl dynamig quotas:\n%s", out)
	}
	if out := w.kubectlDynamig("explain", "c"); !strings.Contains(out, want) {
		t.Errorf("kubectl dynamig explain c does not say %q:\n%s", want, out)
	}
	// d comes as a's room is freed: c and d race for it, and one of them wins.
	w.Create(pod("d", "mig", 1, 8000))
	w.Delete("a")
	w.Gone("n", "a")
	var winner, loser string
	w.WaitFor("c or d bound", 90*time.Second, func() (bool, string) {
		c, d := w.Get("c"), w.Get("d")
		switch {
		case c.Spec.NodeName != "" && d.Spec.NodeName != "":
			t.Fatalf("c and d both bound: 3 × 9,856 MiB is past the quota's 20,000")
		case c.Spec.NodeName != "":
			winner, loser = "c", "d"
		case d.Spec.NodeName != "":
			winner, loser = "d", "c"
		}
		return winner != "", "neither bound"
	})
	w.Running(winner)
	if msg := w.Pending(loser); !strings.Contains(msg, "namespace GPU quota exceeded") {
		t.Errorf("%s's reason: %q", loser, msg)
	}
	w.Delete("b")
	w.Running(loser)
}

// TestNodePolicyOverHost: with the shipped profile, the node policy holds for CPU and
// memory: of two nodes alike in GPUs, a binpack GPU pod goes to the one whose CPU is more
// requested, a spread one to the other (kube-scheduler's NodeResourcesFit alone would spread
// both).
func TestNodePolicyOverHost(t *testing.T) {
	w := start(t, mig("a", "A100-40GB"), mig("b", "A100-40GB"))
	node, err := w.C.CoreV1().Nodes().Get(w.Ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Half of b's allocatable CPU, on b without the scheduler.
	half := node.Status.Allocatable.Cpu().MilliValue() / 2
	busy := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "busy", Namespace: "default"}, Spec: v1.PodSpec{NodeName: "b",
		Containers: []v1.Container{{Name: "main", Image: "ubuntu:22.04", Command: []string{"sleep", "infinity"},
			Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: *resource.NewMilliQuantity(half, resource.DecimalSI)}}}}}}
	w.Create(busy)
	w.Running("busy")
	// Each alone on GPUs alike: only the CPU tells a from b.
	w.Create(pod("spread", "mig", 1, 8000, api.NodeSchedulerPolicyAnnotation, api.PolicySpread))
	w.Running("spread")
	if n := w.Get("spread").Spec.NodeName; n != "a" {
		t.Errorf("the spread pod is on %s, want a", n)
	}
	w.Delete("spread")
	w.Gone("a", "spread")
	w.gonePods("spread")
	w.Create(pod("packed", "mig", 1, 8000))
	w.Running("packed")
	if n := w.Get("packed").Spec.NodeName; n != "b" {
		t.Errorf("the binpack pod is on %s, want b (its CPU half requested; the node order alone picks a)", n)
	}
}

// TestNUMABind: a pod annotated nvidia.com/numa-bind: "true" gets its devices on GPUs of one
// NUMA node: with one GPU of NUMA node 0 taken, the two whole GPUs it asks for are both on
// NUMA node 1, which the node's inventory says (the simulator's GPUs over two NUMA nodes).
func TestNUMABind(t *testing.T) {
	node := mig("n", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB")
	node.NUMANodes = 2
	w := start(t, node)
	uuids := w.SB.Nodes()[0].GPUUUIDs
	w.Create(pod("first", "mig", 1, 40000, api.UseGPUUUIDAnnotation, uuids[0]))
	w.Running("first")
	w.Create(pod("bound", "mig", 2, 40000, api.NUMABindAnnotation, "true"))
	recs := w.Running("bound")["bound"]
	n, err := w.C.CoreV1().Nodes().Get(w.Ctx, "n", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	numa := map[string]int{}
	for _, g := range gpus {
		numa[g.ID] = g.Numa
	}
	if len(recs) != 2 || numa[recs[0].GPUUUID] != 1 || numa[recs[1].GPUUUID] != 1 || recs[0].GPUUUID == recs[1].GPUUUID {
		t.Errorf("bound: %v, want two GPUs of NUMA node 1 (the inventory's NUMA nodes: %v)", recs, numa)
	}
}

func TestModeRouting(t *testing.T) {
	w := start(t) // mig-node and core-node
	w.Create(pod("m", "mig", 1, 4000), pod("h", "hami-core", 1, 4000), pod("either", "", 1, 4000))
	recs := w.Running("m", "h", "either")
	if n := w.Get("m").Spec.NodeName; n != "mig-node" {
		t.Errorf("mig pod on %s", n)
	}
	h := w.Get("h")
	if h.Spec.NodeName != "core-node" || h.Annotations[api.DevicesAllocatedAnnotation] == "" || h.Annotations[api.MigReservationsAnnotation] != "" {
		t.Errorf("hami-core pod: node %s, annotations %v", h.Spec.NodeName, h.Annotations)
	}
	if len(w.Instances("core-node")) != 0 {
		t.Errorf("a hami-core node gets no MIG instance")
	}
	w.seesOwnDevices("m", "main", recs["m"])
	if e := w.Get("either"); e.Spec.NodeName == "mig-node" {
		w.seesOwnDevices("either", "main", recs["either"])
	}
	// The hami-core pod sees its one share: the core node's GPU and HAMi-core's limit.
	shares, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, h.Annotations[api.DevicesAllocatedAnnotation])
	if err != nil || len(shares) != 1 || len(shares[0]) != 1 {
		t.Fatalf("h's shares %v: %v", shares, err)
	}
	env, err := w.SB.ContainerEnv(w.Ctx, "default", "h", "main")
	if err != nil {
		t.Fatal(err)
	}
	if env["NVIDIA_VISIBLE_DEVICES"] != shares[0][0].UUID || env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "4000m" {
		t.Errorf("h sees NVIDIA_VISIBLE_DEVICES=%q CUDA_DEVICE_MEMORY_LIMIT_0=%q, want %q and 4000m", env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"], shares[0][0].UUID)
	}
}

// TestNodeRestarts: the device plugin restarts (and adopts its instances), the real kubelet
// restarts (deleting every socket in the device-plugin directory, so the plugin registers
// again; running containers are left alone and no Allocate is made), or the container
// restarts (PreStartContainer adopts the same instance): the pod keeps its instances and
// sees the same MIG UUIDs, and a pod created after it runs beside it. A reboot loses every
// instance and CDI spec while the pod stays bound: its container comes back with instances
// re-created at the reserved placements, their new UUIDs written back and seen.
func TestNodeRestarts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restart  func(w *world) error
		restarts int32 // of the container, after; -1: either (a reboot's count depends on whether the kubelet saw the container missing before it made it again)
		newUUIDs bool
	}{
		{"device plugin", func(w *world) error { return w.SB.RestartDevicePlugin(w.Ctx, "n") }, 0, false},
		{"kubelet", func(w *world) error { return w.SB.RestartKubelet(w.Ctx, "n") }, 0, false},
		{"container", func(w *world) error { return w.SB.FinishPod(w.Ctx, "default", "a", false) }, 1, false},
		{"reboot", func(w *world) error { return w.SB.RebootNode(w.Ctx, "n") }, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := start(t, mig("n", "A100-40GB"))
			w.Create(pod("a", "mig", 2, 9000))
			recs := w.Running("a")
			before := w.Instances("n")
			uid := w.Get("a").UID
			first, _ := w.SB.Container("n", uid, "main")
			if err := tc.restart(w); err != nil {
				t.Fatal(err)
			}
			if tc.restarts > 0 {
				w.WaitFor("a's container restarted", 60*time.Second, func() (bool, string) {
					p := w.Get("a")
					return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == tc.restarts && p.Status.ContainerStatuses[0].State.Running != nil,
						fmt.Sprintf("%+v", p.Status.ContainerStatuses)
				})
			}
			if tc.newUUIDs {
				w.WaitFor("a's container created again", 90*time.Second, func() (bool, string) {
					c, ok := w.SB.Container("n", uid, "main")
					return ok && c.Boot > first.Boot, "the runtime has not created it yet"
				})
			}
			after := w.Running("a")
			if p := w.Get("a"); tc.restarts == 0 && p.Status.ContainerStatuses[0].RestartCount != 0 {
				t.Errorf("a restarted %d times", p.Status.ContainerStatuses[0].RestartCount)
			}
			hw := w.Instances("n")
			w.SameHardware("n", after)
			w.seesOwnDevices("a", "main", after["a"])
			for i := range recs["a"] {
				old, now := recs["a"][i], after["a"][i]
				if old.Placement != now.Placement || old.GPUUUID != now.GPUUUID {
					t.Errorf("device %d moved: %s → %s", i, old.Placement, now.Placement)
				}
				if changed := old.MigUUID != now.MigUUID; changed != tc.newUUIDs {
					t.Errorf("device %d: MIG UUID %s → %s (want changed: %v)", i, old.MigUUID, now.MigUUID, tc.newUUIDs)
				}
			}
			if !tc.newUUIDs && (len(hw["a"]) != 2 || hw["a"][0] != before["a"][0] || hw["a"][1] != before["a"][1]) {
				t.Errorf("instances changed: %v → %v", before, hw)
			}
			if c, _ := w.SB.Container("n", uid, "main"); tc.restarts == 0 && !tc.newUUIDs && (c.ID != first.ID || c.Attempt != first.Attempt || c.Boot != first.Boot) {
				t.Errorf("the container was created again (%s → %s)", first.ID, c.ID)
			}
			w.Create(pod("b", "mig", 1, 4000))
			got := w.Running("b")
			got["a"] = after["a"]
			sandboxtest.NoOverlap(t, got)
			w.SameHardware("n", got)
		})
	}
}

// TestInFlightBindingLoses is the review's scenario without a Lease: a Binding from a
// previous scheduler instance (signed with the same key) lands after the new scheduler
// gave the same placement to a pod that already runs. Never two live instances on one
// placement: the late pod's PreStartContainer finds the placement held by a running pod and
// marks it failed with the reason; dynamig-scheduler evicts it (no node agent may evict);
// the winner is untouched. Recreated, as its
// controller would, the loser is placed and runs beside the winner.
func TestInFlightBindingLoses(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	w.Create(pod("winner", "mig", 1, 9000))
	won := w.Running("winner")["winner"][0]
	key := w.schedulerKey()
	loser := pod("loser", "mig", 1, 9000)
	loser.Spec.SchedulerName = "nobody" // bound below, as the old scheduler's Binding
	// The admission policies let only dynamig-scheduler write a Binding with a reservation;
	// the test writes the old scheduler's, so they are lifted (the signature still holds).
	if err := w.C.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().DeleteCollection(w.Ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	w.WaitFor("loser created", 30*time.Second, func() (bool, string) {
		_, err := w.C.CoreV1().Pods("default").Create(w.Ctx, loser, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	created := w.Get("loser")
	annotations := map[string]string{
		api.MigReservationsAnnotation: fmt.Sprintf(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":%q,"profile":%q,"placement":{"start":%d,"size":%d}}]`,
			won.GPUUUID, won.Profile, won.Placement.Start, won.Placement.Size),
		api.BindPhaseAnnotation: api.BindPhaseAllocating,
	}
	if err := api.SignReservation(key, string(created.UID), "n", annotations); err != nil {
		t.Fatal(err)
	}
	if err := w.C.CoreV1().Pods("default").Bind(w.Ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: "loser", Namespace: "default", UID: created.UID, Annotations: annotations},
		Target:     v1.ObjectReference{Kind: "Node", Name: "n"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.evictedBecause("loser", created.UID, "double-book")
	after := w.Running("winner")
	if after["winner"][0].MigUUID != won.MigUUID || w.Get("winner").Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the winner was touched: %+v → %+v", won, after["winner"][0])
	}
	w.seesOwnDevices("winner", "main", after["winner"])
	w.WaitFor("the evicted loser gone", 60*time.Second, func() (bool, string) {
		_, err := w.C.CoreV1().Pods("default").Get(w.Ctx, "loser", metav1.GetOptions{})
		return err != nil, fmt.Sprint(err)
	})
	w.Create(pod("loser", "mig", 1, 9000))
	recs := w.Running("winner", "loser")
	sandboxtest.NoOverlap(t, recs)
	w.SameHardware("n", recs)
	w.seesOwnDevices("loser", "main", recs["loser"])
}

func TestSchedulerRestartNoDoubleBooking(t *testing.T) {
	w := start(t, mig("n", "A100-40GB", "A100-40GB"))
	w.Create(pod("a", "mig", 2, 9000), pod("b", "mig", 1, 19000))
	recs := w.Running("a", "b")
	if err := w.SB.RestartScheduler(w.Ctx); err != nil {
		t.Fatal(err)
	}
	w.Create(pod("c", "mig", 2, 9000), pod("d", "mig", 1, 19000))
	for k, v := range w.Running("c", "d") {
		recs[k] = v
	}
	sandboxtest.NoOverlap(t, recs)
	w.SameHardware("n", recs)
}

func TestAdmissionPolicies(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	forged := pod("forged", "mig", 1, 4000, api.MigReservationsAnnotation, `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.5gb","placement":{"start":0,"size":1}}]`)
	other := pod("other-scheduler", "mig", 1, 4000)
	other.Spec.SchedulerName = "volcano"
	pinned := pod("pinned", "mig", 1, 4000)
	pinned.Spec.NodeName = "n"
	for _, tc := range []struct {
		p    *v1.Pod
		want string
	}{
		{forged, api.MigReservationsAnnotation},
		{other, "schedulerName: dynamig-scheduler"},
		{pinned, "nodeName"},
	} {
		_, err := w.C.CoreV1().Pods("default").Create(w.Ctx, tc.p, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal naming %q", tc.p.Name, err, tc.want)
		}
	}
}

// TestWebhook: through the API server, over TLS, the shipped MutatingWebhookConfiguration
// gives GPU pods that name no scheduler (or default-scheduler) dynamig-scheduler, init
// containers included, and nothing else; pods and namespaces labelled hami.io/webhook:
// ignore are left alone (and so meet the validating policy), and a pod naming another
// scheduler is refused with the message that says what to do. The init-container rule: a
// GPU on a plain init container is refused at scheduling with what to do instead (the
// kubelet neither lists plain init containers in PodResources nor keeps their devices
// apart from the app containers'), and the sidecar form of the same pod runs.
func TestWebhook(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	optOut := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "opted-out", Labels: map[string]string{"hami.io/webhook": "ignore"}}}
	if _, err := w.C.CoreV1().Namespaces().Create(w.Ctx, optOut, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	unnamed := func(name, ns string) *v1.Pod {
		p := pod(name, "mig", 1, 4000)
		p.Namespace, p.Spec.SchedulerName = ns, ""
		return p
	}
	defaultNamed := unnamed("default-named", "default")
	defaultNamed.Spec.SchedulerName = "default-scheduler"
	initOnly := unnamed("init-only", "default")
	initOnly.Spec.InitContainers = initOnly.Spec.Containers
	initOnly.Spec.InitContainers[0].Name = "init"
	initOnly.Spec.Containers = []v1.Container{{Name: "main", Image: "busybox"}}
	sidecarOnly := initOnly.DeepCopy()
	sidecarOnly.Name = "sidecar-only"
	sidecarOnly.Spec.InitContainers[0].RestartPolicy = ptr.To(v1.ContainerRestartPolicyAlways)
	cpu := unnamed("cpu", "default")
	cpu.Spec.Containers[0].Resources = v1.ResourceRequirements{}
	labelled := unnamed("labelled", "default")
	labelled.Labels = map[string]string{"hami.io/webhook": "ignore"}
	other := unnamed("other", "default")
	other.Spec.SchedulerName = "volcano"
	refused := "names schedulerName default-scheduler: set schedulerName: dynamig-scheduler"
	for _, tc := range []struct {
		p             *v1.Pod
		wantScheduler string // "" : refused with wantErr
		wantErr       string
	}{
		{unnamed("unnamed", "default"), api.DefaultSchedulerName, ""},
		{defaultNamed, api.DefaultSchedulerName, ""},
		{initOnly, api.DefaultSchedulerName, ""},
		{sidecarOnly, api.DefaultSchedulerName, ""},
		{cpu, "default-scheduler", ""},
		{unnamed("in-opted-out-namespace", optOut.Name), "", refused},
		{labelled, "", refused},
		{other, "", "names schedulerName volcano: set schedulerName: dynamig-scheduler"},
	} {
		created, err := w.C.CoreV1().Pods(tc.p.Namespace).Create(w.Ctx, tc.p, metav1.CreateOptions{})
		switch {
		case tc.wantScheduler == "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: %v, want a refusal saying %q", tc.p.Name, err, tc.wantErr)
		case tc.wantScheduler != "" && err != nil:
			t.Errorf("%s: %v", tc.p.Name, err)
		case tc.wantScheduler != "" && created.Spec.SchedulerName != tc.wantScheduler:
			t.Errorf("%s: schedulerName %q, want %q", tc.p.Name, created.Spec.SchedulerName, tc.wantScheduler)
		}
	}
	// The mutated pods run: dynamig-scheduler placed them and the device plugin realised them.
	recs := w.Running("unnamed", "default-named", "sidecar-only")
	sandboxtest.NoOverlap(t, recs)
	w.seesOwnDevices("sidecar-only", "init", recs["sidecar-only"])
	if msg := w.Pending("init-only"); !strings.Contains(msg, `init container "init" requests nvidia.com/gpu`) || !strings.Contains(msg, "move the GPU request to a sidecar or the main container") {
		t.Errorf("init-only: %q, want the init-container rule with what to do", msg)
	}
	// cert-controller made the serving certificate and injected its CA.
	cfg, err := w.C.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(w.Ctx, "dynamig-webhook", metav1.GetOptions{})
	if err != nil || len(cfg.Webhooks) != 1 || len(cfg.Webhooks[0].ClientConfig.CABundle) == 0 {
		t.Errorf("webhook configuration: %v %+v", err, cfg)
	}
	secret, err := w.C.CoreV1().Secrets(api.DefaultSystemNamespace).Get(w.Ctx, "dynamig-webhook-cert", metav1.GetOptions{})
	if err != nil || len(secret.Data["tls.crt"]) == 0 || string(secret.Data["ca.crt"]) != string(cfg.Webhooks[0].ClientConfig.CABundle) {
		t.Errorf("certificate Secret: %v (keys %d)", err, len(secret.Data))
	}
}

// TestUnsignedOrTamperedReservationsGetNoInstance: with the admission policies removed (an
// operator's mistake), a pod bound directly with a reservation dynamig-scheduler did not
// sign, signed with another key, or signed and then changed gets no instance: the device
// plugin verifies the signature at PreStartContainer before creating anything, says why in
// a Warning event and on the pod, and evicts it; the container is never created.
func TestUnsignedOrTamperedReservationsGetNoInstance(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	if err := w.C.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().DeleteCollection(w.Ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	uuid := w.SB.Nodes()[0].GPUUUIDs[0]
	otherKey, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	schedulerKey := w.schedulerKey()
	for i, tc := range []struct {
		name    string
		sign    func(uid types.UID, a map[string]string)
		wantMsg string
	}{
		{"unsigned", func(types.UID, map[string]string) {}, "carries no " + api.ReservationSignatureAnnotation},
		{"wrong-key", func(uid types.UID, a map[string]string) { _ = api.SignReservation(otherKey, string(uid), "n", a) }, "which is not in ConfigMap"},
		{"tampered", func(uid types.UID, a map[string]string) {
			_ = api.SignReservation(schedulerKey, string(uid), "n", a)
			a[api.MigReservationsAnnotation] = strings.Replace(a[api.MigReservationsAnnotation], `"1g.5gb"`, `"7g.40gb"`, 1)
			a[api.MigReservationsAnnotation] = strings.Replace(a[api.MigReservationsAnnotation], `"size":1`, `"size":8`, 1)
		}, "does not match its reservation"},
	} {
		p := pod(tc.name, "mig", 1, 4000)
		p.Spec.SchedulerName = "nobody" // no scheduler binds it
		w.WaitFor("the policies gone", 30*time.Second, func() (bool, string) {
			_, err = w.C.CoreV1().Pods("default").Create(w.Ctx, p, metav1.CreateOptions{})
			return err == nil, fmt.Sprint(err)
		})
		created := w.Get(tc.name)
		annotations := map[string]string{
			api.MigReservationsAnnotation: fmt.Sprintf(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":%q,"profile":"1g.5gb","placement":{"start":%d,"size":1}}]`, uuid, i),
			api.BindPhaseAnnotation:       api.BindPhaseAllocating,
		}
		tc.sign(created.UID, annotations)
		if err := w.C.CoreV1().Pods("default").Bind(w.Ctx, &v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: "default", UID: created.UID, Annotations: annotations},
			Target:     v1.ObjectReference{Kind: "Node", Name: "n"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		w.evictedBecause(tc.name, created.UID, tc.wantMsg)
		if hw := w.Instances("n"); len(hw) != 0 {
			t.Errorf("%s: a refused reservation got instances: %v", tc.name, hw)
		}
		if _, ok := w.SB.Container("n", created.UID, "main"); ok {
			t.Errorf("%s: the container was created", tc.name)
		}
	}
}

// schedulerKey reads the scheduler's reservation signing key from its Secret.
func (w *world) schedulerKey() ed25519.PrivateKey {
	w.T.Helper()
	var key ed25519.PrivateKey
	w.WaitFor("the scheduler's signing key", 30*time.Second, func() (bool, string) {
		k, err := signing.LoadSigningKey(w.Ctx, w.C, api.DefaultSigningKeyNamespace, api.DefaultSystemNamespace, false)
		key = k
		return err == nil, fmt.Sprint(err)
	})
	return key
}

// evictedBecause waits for the device plugin's Warning event on the pod (of that UID)
// saying why its reservation cannot be realised, and for the pod's eviction (by
// dynamig-scheduler, which evicts the pods a device plugin marked failed).
func (w *world) evictedBecause(name string, uid types.UID, why string) {
	w.T.Helper()
	w.WaitFor(name+" evicted with the reason", 60*time.Second, func() (bool, string) {
		evs, err := w.C.CoreV1().Events("default").List(w.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err.Error()
		}
		said := false
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.InvolvedObject.UID == uid && e.Type == v1.EventTypeWarning && e.Reason == "ReservationNotRealisable" && strings.Contains(e.Message, why) {
				said = true
			}
		}
		if !said {
			return false, fmt.Sprintf("no Warning ReservationNotRealisable saying %q; events: %v", why, seen)
		}
		p, err := w.C.CoreV1().Pods("default").Get(w.Ctx, name, metav1.GetOptions{})
		if err == nil && p.UID == uid && p.DeletionTimestamp == nil {
			return false, "not evicted yet"
		}
		return true, ""
	})
}

// realisedEvents waits for the device plugin's Normal Realised event on each pod (of its
// UID) for every MIG device of its reservation, naming the device's MIG UUID.
func (w *world) realisedEvents(recs map[string][]api.MigReservation) {
	w.T.Helper()
	for name, rs := range recs {
		uid := w.Get(name).UID
		w.WaitFor(name+"'s Realised events", 30*time.Second, func() (bool, string) {
			evs, err := w.C.CoreV1().Events("default").List(w.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			if err != nil {
				return false, err.Error()
			}
			var seen []string
			said := map[string]bool{}
			for _, e := range evs.Items {
				seen = append(seen, e.Reason+": "+e.Message)
				for _, r := range rs {
					if e.InvolvedObject.UID == uid && e.Type == v1.EventTypeNormal && e.Reason == "Realised" && strings.Contains(e.Message, r.MigUUID) {
						said[r.MigUUID] = true
					}
				}
			}
			for _, r := range rs {
				if !said[r.MigUUID] {
					return false, fmt.Sprintf("no Normal Realised naming %s; events: %v", r.MigUUID, seen)
				}
			}
			return true, ""
		})
	}
}

func TestManyPodsAcrossNodes(t *testing.T) {
	var nodes []sandboxconfig.NodeConfig
	for i := 0; i < 10; i++ {
		nodes = append(nodes, mig(fmt.Sprintf("n%d", i), "A100-40GB", "A100-40GB", "A100-40GB"))
	}
	w := start(t, nodes...)
	var names []string
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 200; i++ {
		name := fmt.Sprintf("p%03d", i)
		names = append(names, name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := w.C.CoreV1().Pods("default").Create(w.Ctx, pod(name, "mig", 1, 4000), metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	recs := w.Running(names...)
	if len(recs) != 200 {
		t.Fatalf("%d of 200 realised", len(recs))
	}
	sandboxtest.NoOverlap(t, recs)
	perNode := map[string]map[string][]api.MigReservation{}
	for name := range recs {
		n := w.Get(name).Spec.NodeName
		if perNode[n] == nil {
			perNode[n] = map[string][]api.MigReservation{}
		}
		perNode[n][name] = recs[name]
	}
	for n, rs := range perNode {
		w.SameHardware(n, rs)
	}
	if err := w.C.CoreV1().Pods("default").DeleteCollection(w.Ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		w.WaitFor("every instance reclaimed on "+n.Name, 60*time.Second, func() (bool, string) {
			hw, err := w.SB.Instances(n.Name)
			return err == nil && len(hw) == 0, fmt.Sprintf("%d left", len(hw))
		})
	}
}

// TestPreemption: a higher-priority MIG pod that fits only where a lower-priority one runs
// preempts it through kube-scheduler's DefaultPreemption (DynamicMIG's Filter judging the node
// without the victim), and is realised on the freed placement once the victim's instance is
// reclaimed. Part of every minor's suite (`make test`).
func TestPreemption(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	for name, value := range map[string]int32{"low": 100, "high": 1000} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := w.C.SchedulingV1().PriorityClasses().Create(w.Ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	low, high := pod("low", "mig", 1, 39000), pod("high", "mig", 1, 19000)
	low.Spec.PriorityClassName, high.Spec.PriorityClassName = "low", "high"
	w.Create(low)
	held := w.Running("low")["low"][0]
	w.Create(high)
	w.WaitFor("low preempted", 60*time.Second, func() (bool, string) {
		_, err := w.C.CoreV1().Pods("default").Get(w.Ctx, "low", metav1.GetOptions{})
		return err != nil, "low still exists"
	})
	got := w.Running("high")["high"][0]
	if got.GPUUUID != held.GPUUUID || !got.Placement.Overlaps(held.Placement) {
		t.Errorf("high at %s on %s, want on low's freed %s on %s", got.Placement, got.GPUUUID, held.Placement, held.GPUUUID)
	}
	w.Gone("n", "low")
	w.SameHardware("n", map[string][]api.MigReservation{"high": {got}})
	w.seesOwnDevices("high", "main", []api.MigReservation{got})
}
