package inspect

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/test/fixture"
)

// a100 is an A100-PCIE-40GB's inventory entry, as the device plugin publishes it with the
// default allowlist, under the GPU UUID id.
func a100(t *testing.T, id string) api.GPU {
	t.Helper()
	g := fixture.Inventory(t, "a100", fixture.ModeConfig("a100", api.ModeMIG), "A100-PCIE-40GB")[0]
	g.ID = id
	return g
}

func node(t *testing.T, name string, gpus ...api.GPU) v1.Node {
	t.Helper()
	raw, err := api.EncodeInventory(gpus)
	if err != nil {
		t.Fatal(err)
	}
	return v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{api.NodeInventoryAnnotation: raw}}}
}

func migPod(t *testing.T, name, nodeName, phase string, recs ...api.MigReservation) v1.Pod {
	t.Helper()
	for i := range recs {
		recs[i].DeviceIndex = i
	}
	raw, err := api.EncodeMigReservations(recs)
	if err != nil {
		t.Fatal(err)
	}
	return v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{
		api.MigReservationsAnnotation: raw, api.BindPhaseAnnotation: phase}}, Spec: v1.PodSpec{NodeName: nodeName}}
}

func lease(node string, renewed time.Time) coordinationv1.Lease {
	return coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeasePrefix + node},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: ptr.To[int32](40)}}
}

func rec(gpu, profile string, start, size int) api.MigReservation {
	return api.MigReservation{GPUUUID: gpu, Profile: profile, Placement: api.Placement{Start: start, Size: size}}
}

func TestBuild(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	gpu := "GPU-1"
	realised := rec(gpu, "2g.10gb", 4, 2)
	realised.SetRuntime("MIG-9", 1, 0)
	failed := migPod(t, "lost", "n1", api.BindPhaseFailed, rec(gpu, "1g.5gb", 6, 1))
	failed.Annotations[api.BindFailureAnnotation] = "placement [6,7) is held by another pod's instance"
	ended := migPod(t, "done", "n1", api.BindPhaseSuccess, rec(gpu, "1g.5gb", 7, 1))
	ended.Status.Phase = v1.PodSucceeded
	pending := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "waiting", Namespace: "default"}, Spec: v1.PodSpec{Containers: []v1.Container{{
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1")}}}}}}
	cpu := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "default"}, Spec: v1.PodSpec{NodeName: "n1"}}
	pods := []v1.Pod{
		migPod(t, "two", "n1", api.BindPhaseAllocating, rec(gpu, "2g.10gb", 0, 2), rec(gpu, "2g.10gb", 2, 2)),
		migPod(t, "one", "n1", api.BindPhaseSuccess, realised),
		failed, ended, pending, cpu,
	}
	nodes := []v1.Node{node(t, "n1", a100(t, gpu)), node(t, "n2"), {ObjectMeta: metav1.ObjectMeta{Name: "cpu-node"}}, {ObjectMeta: metav1.ObjectMeta{Name: "n4"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n3", Annotations: map[string]string{api.NodeInventoryAnnotation: "{"}}}}
	c := Build(nodes, pods, []coordinationv1.Lease{lease("n1", now.Add(-10*time.Second)), lease("n2", now.Add(-time.Minute)), lease("n4", now)},
		api.ResourceCount, now)

	states := map[string]string{}
	for _, p := range c.Pods {
		states[p.Name] = p.State + "|" + p.Reason
	}
	for name, want := range map[string]string{"two": "reserved|", "one": "realised|", "lost": "failed|placement [6,7) is held by another pod's instance",
		"done": "ended|", "waiting": "pending|"} {
		if states[name] != want {
			t.Errorf("pod %s: state %q, want %q", name, states[name], want)
		}
	}
	if _, ok := states["cpu"]; ok {
		t.Error("a CPU pod is listed as a GPU pod")
	}

	byName := map[string]Node{}
	for _, n := range c.Nodes {
		byName[n.Name] = n
	}
	if _, ok := byName["cpu-node"]; ok {
		t.Error("a node without inventory or heartbeat is listed")
	}
	for name, want := range map[string][2]string{"n1": {"fresh", ""}, "n2": {"expired", ""}, "n3": {"missing", "not"}, "n4": {"fresh", "missing"}} {
		n := byName[name]
		if n.Heartbeat != want[0] || (want[1] == "" && n.Inventory != "") || (want[1] != "" && n.Inventory == "") {
			t.Errorf("node %s: heartbeat %q inventory %q, want %q and %q", name, n.Heartbeat, n.Inventory, want[0], want[1])
		}
	}

	g := byName["n1"].GPUs[0]
	var got []string
	for _, s := range g.Slots {
		got = append(got, s.Placement.String()+" "+s.Pod+" "+s.Profile)
	}
	// The failed pod's reservation still holds its slot (the device plugin evicts it); the
	// ended pod's does not.
	want := []string{"[0,2) default/two 2g.10gb", "[2,4) default/two 2g.10gb", "[4,6) default/one 2g.10gb", "[6,7) default/lost 1g.5gb", "[7,8)  "}
	if len(got) != len(want) {
		t.Fatalf("slots %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("slot %d: %q, want %q", i, got[i], want[i])
		}
	}
	room := map[string]ProfileRoom{}
	for _, r := range g.Room {
		room[r.Profile] = r
	}
	// Three 2g and a 1g hold all 7 compute slices: no 1g.5gb fits, whatever the free slot.
	if r := room["1g.5gb"]; r.More != 0 || len(r.Free) != 0 || r.Limit != "1g.5gb needs 1 compute slices and 0 of 7 are free" {
		t.Errorf("1g.5gb room: %+v", r)
	}
	if r := room["2g.10gb"]; r.More != 0 || len(r.Free) != 0 {
		t.Errorf("2g.10gb room: %+v", r)
	}
	if r := room["7g.40gb"]; r.More != 0 {
		t.Errorf("7g.40gb room: %+v", r)
	}
}

func TestRoomLimits(t *testing.T) {
	g := a100(t, "GPU-1")
	// Seven 1g.5gb: the profile's instance count is reached (slot [7,8) stays free, and no
	// 1g.5gb placement starts there).
	var used []SlotRange
	for i := range 7 {
		used = append(used, SlotRange{Placement: api.Placement{Start: i, Size: 1}, Pod: "p", Profile: "1g.5gb"})
	}
	out := buildGPU(g, "n", nil)
	if len(out.Room) != 4 || out.Room[0].More != 7 {
		t.Fatalf("empty GPU room: %+v", out.Room)
	}
	pods := []Pod{{Namespace: "d", Name: "p", Node: "n", State: "realised"}}
	for _, u := range used {
		pods[0].Reservations = append(pods[0].Reservations, rec("GPU-1", "1g.5gb", u.Placement.Start, 1))
	}
	out = buildGPU(g, "n", pods)
	r := out.Room[0]
	if r.Profile != "1g.5gb" || r.More != 0 || r.Limit != "1g.5gb has its 7 instances" || len(r.Free) != 0 {
		t.Errorf("full of 1g.5gb: %+v (want no room and the instance limit)", r)
	}
	if slots := out.Slots; len(slots) != 8 || slots[7].Pod != "" || slots[7].Placement != (api.Placement{Start: 7, Size: 1}) {
		t.Errorf("slots: %+v", slots)
	}
}

// world is a described cluster for explain and simulate: nodes with the inventory the
// device plugin's own code publishes for simulated GPUs, fresh heartbeats.
func world(t *testing.T, device *config.DeviceConfig, specs ...string) ([]v1.Node, []coordinationv1.Lease) {
	t.Helper()
	desc, err := ParseNodes(specs)
	if err != nil {
		t.Fatal(err)
	}
	nodes, leases, err := BuildNodes(t.Context(), desc, device, api.DefaultSystemNamespace, testNow)
	if err != nil {
		t.Fatal(err)
	}
	return nodes, leases
}

var testNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func policy(t *testing.T, device *config.DeviceConfig) *Policy {
	t.Helper()
	args := &config.DynamicMIGArgs{}
	args.SetDefaults()
	return &Policy{Args: args, Device: device}
}

// gpuPod asks for one device of memory MiB in mode, pinned to a node by its selector.
func gpuPod(name, mode, memory, onNode string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
			api.ResourceCount: resource.MustParse("1"), api.ResourceMemory: resource.MustParse(memory)}}}}}}
	if mode != "" {
		p.Annotations[api.VGPUModeAnnotation] = mode
	}
	if onNode != "" {
		p.Spec.NodeSelector = map[string]string{v1.LabelHostname: onNode}
	}
	return p
}

// bound is pod bound to node holding the reservations (realised).
func bound(t *testing.T, name, node string, recs ...api.MigReservation) v1.Pod {
	t.Helper()
	p := migPod(t, name, node, api.BindPhaseSuccess, recs...)
	p.Status.Phase = v1.PodRunning
	return p
}

func gpuID(t *testing.T, n v1.Node, i int) string {
	t.Helper()
	gpus, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
	if err != nil || len(gpus) <= i {
		t.Fatalf("node %s inventory: %v", n.Name, err)
	}
	return gpus[i].ID
}

// TestExplainReasons: every refusal explain names is the scheduler's, per node, with the
// smallest change where other pods are in the way.
func TestExplainReasons(t *testing.T) {
	device := config.DefaultDeviceConfig()
	// RTX PRO 6000 nodes may only make 1g.24gb+me.all (which holds every media engine, so
	// only -me profiles fit beside it) and 2g.48gb.
	device.Nvidia.MigProfileAllowlist = append([]config.AllowlistEntry{{Models: []string{"RTX-PRO-6000-Blackwell-Server"}, Profiles: []string{"1g.24gb+me.all", "2g.48gb"}}}, device.Nvidia.MigProfileAllowlist...)
	nodes, leases := world(t, device, "frag=A100-40GB", "me=RTX-PRO-6000-Blackwell-Server", "core=A100-40GB:hami-core", "gone=A100-40GB")
	frag, me := gpuID(t, nodes[0], 0), gpuID(t, nodes[1], 0)
	leases[3].Spec.RenewTime = &metav1.MicroTime{Time: testNow.Add(-time.Hour)}
	nodes[2].Spec.Taints = nil
	tainted := nodes[0].DeepCopy()
	tainted.Name, tainted.Labels = "tainted", map[string]string{v1.LabelHostname: "tainted"}
	tainted.Spec.Taints = []v1.Taint{{Key: "dedicated", Value: "infra", Effect: v1.TaintEffectNoSchedule}}
	nodes = append(nodes, *tainted)
	// frag holds 1g.5gb at slots 3, 4, 5 and 6: four slots free (0-2, 7) but no 3g.20gb
	// placement ([0,4) or [4,8)) free.
	pods := []v1.Pod{
		bound(t, "s3", "frag", rec(frag, "1g.5gb", 3, 1)), bound(t, "s4", "frag", rec(frag, "1g.5gb", 4, 1)),
		bound(t, "s5", "frag", rec(frag, "1g.5gb", 5, 1)), bound(t, "s6", "frag", rec(frag, "1g.5gb", 6, 1)),
		bound(t, "all-me", "me", rec(me, "1g.24gb+me.all", 0, 3)),
	}
	for _, tc := range []struct {
		name        string
		pod         *v1.Pod
		node        string // the node the pod is pinned to; every other node refuses by selector
		reason      string
		fitsWithout [][]string
	}{
		{"no profile", gpuPod("huge", api.ModeMIG, "45000", "frag"), "frag", string(placement.ReasonNoProfile), nil},
		{"all taken", gpuPod("whole", api.ModeMIG, "39000", "frag"), "frag", string(placement.ReasonPlacementsTaken), [][]string{}},
		{"fragmented", gpuPod("half", api.ModeMIG, "19000", "frag"), "frag", string(placement.ReasonFragmented), [][]string{{"default/s3"}}},
		{"instance limit", gpuPod("beside", api.ModeMIG, "40000", "me"), "me", string(placement.ReasonInstanceLimit), [][]string{{"default/all-me"}}},
		{"heartbeat expired", gpuPod("late", api.ModeMIG, "4000", "gone"), "gone", string(placement.ReasonHeartbeat), nil},
		{"mode", gpuPod("mig-on-core", api.ModeMIG, "4000", "core"), "core", ReasonNotPreFiltered, nil},
		{"mode, hami-core on MIG", gpuPod("core-on-mig", api.ModeHAMiCore, "4000", "frag"), "frag", ReasonNotPreFiltered, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Explain(tc.pod, nodes, pods, leases, policy(t, device), testNow)
			if err != nil {
				t.Fatal(err)
			}
			got := e.Nodes
			if len(got) != len(nodes) {
				t.Fatalf("%d verdicts for %d nodes", len(got), len(nodes))
			}
			for _, v := range got {
				want := ReasonNodeAffinity
				switch {
				case (v.Node == "core") != (tc.pod.Annotations[api.VGPUModeAnnotation] == api.ModeHAMiCore):
					// No GPU of the pod's mode: DynamicMIG's PreFilterResult leaves the node
					// out before any filter runs.
					want = ReasonNotPreFiltered
				case v.Node == "tainted": // TaintToleration runs before NodeAffinity
					want = ReasonTaints
				case v.Node == tc.node:
					want = tc.reason
				}
				if v.Fits || v.Reason != want {
					t.Errorf("%s: fits %v, reason %q (%s), want %q", v.Node, v.Fits, v.Reason, v.Detail, want)
				}
				if v.Node != tc.node {
					continue
				}
				if tc.fitsWithout != nil && fmt.Sprint(v.FitsWithout) != fmt.Sprint(tc.fitsWithout) {
					t.Errorf("%s: fits without %v, want %v", v.Node, v.FitsWithout, tc.fitsWithout)
				}
				if blockable(placement.Reason(v.Reason)) && len(v.Layout) != 1 {
					t.Errorf("%s: layout %v, want the GPU's slot map", v.Node, v.Layout)
				}
			}
		})
	}
	// The fragmented layout shows what blocks 3g.20gb.
	e, _ := Explain(gpuPod("half", api.ModeMIG, "19000", "frag"), nodes, pods, leases, policy(t, device), testNow)
	for _, v := range e.Nodes {
		if v.Node == "frag" && (len(v.Layout) != 1 || !strings.Contains(v.Layout[0], "|. . . a b c d .| a=default/s3 1g.5gb [3,4)")) {
			t.Errorf("frag's layout: %q", v.Layout)
		}
	}
	if _, err := Explain(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}, nodes, nil, leases, policy(t, device), testNow); err == nil || !strings.Contains(err.Error(), "not a GPU pod") {
		t.Errorf("CPU pod: %v", err)
	}
	// More than any node's largest device: PreFilter refuses every node at once.
	if e, err := Explain(gpuPod("huge", api.ModeMIG, "50000", ""), nodes, pods, leases, policy(t, device), testNow); err != nil || len(e.Nodes) != 0 ||
		e.Refusal != `container "c" asks for nvidia.com/gpumem 50000 (MiB per GPU device); the largest device any node offers has 48512 MiB` {
		t.Errorf("50000 MiB: %+v, %v", e, err)
	}
}

// TestExplainHostFilters: kube-scheduler's own filters come first, in its order.
func TestExplainHostFilters(t *testing.T) {
	device := config.DefaultDeviceConfig()
	nodes, leases := world(t, device, "a=A100-40GB", "b=A100-40GB", "c=A100-40GB", "d=A100-40GB")
	nodes[0].Spec.Unschedulable = true
	nodes[2].Status.Allocatable[v1.ResourceCPU] = resource.MustParse("1")
	pod := gpuPod("p", api.ModeMIG, "4000", "")
	pod.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}
	pod.Spec.NodeSelector = map[string]string{"gpu": "on"}
	nodes[3].Labels = map[string]string{}
	e, err := Explain(pod, nodes, nil, leases, policy(t, device), testNow)
	if err != nil {
		t.Fatal(err)
	}
	got := e.Nodes
	want := map[string]string{"a": ReasonNodeUnschedulable, "b": "", "c": "Insufficient cpu", "d": ReasonNodeAffinity}
	for _, v := range got {
		if v.Reason != want[v.Node] || v.Fits != (want[v.Node] == "") {
			t.Errorf("%s: fits %v reason %q, want %q", v.Node, v.Fits, v.Reason, want[v.Node])
		}
	}
}

// TestSimulate: pods land one after another, each seeing those before it, higher priority
// first; a pod that fits nowhere gets the refusals counted; a CPU pod is skipped.
func TestSimulate(t *testing.T) {
	device := config.DefaultDeviceConfig()
	nodes, leases := world(t, device, "a100=A100-40GB", "h100=H100-80GB", "core=A100-40GB:hami-core")
	a100 := gpuID(t, nodes[0], 0)
	// a100 already holds a 3g.20gb at [4,8), h100 gets urgent's 3g.40gb first: both are in
	// use, and binpack puts m1 and m2 where they destroy the fewest placements, a 1g.10gb
	// of h100 (9000 MiB fit) rather than a 2g.10gb of a100.
	existing := []v1.Pod{bound(t, "old", "a100", rec(a100, "3g.20gb", 4, 4))}
	urgent := gpuPod("urgent", api.ModeMIG, "30000", "")
	urgent.Spec.Priority = ptr.To[int32](100)
	cpu := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "default"}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	pods := []*v1.Pod{
		gpuPod("m1", api.ModeMIG, "9000", ""), gpuPod("m2", api.ModeMIG, "9000", ""), gpuPod("m3", api.ModeMIG, "4000", ""),
		gpuPod("shared", api.ModeHAMiCore, "4000", ""), cpu, gpuPod("too-big", api.ModeMIG, "90000", ""), gpuPod("whole", api.ModeMIG, "70000", ""), urgent,
	}
	got := Simulate(pods, nodes, existing, leases, policy(t, device), testNow)
	type landing struct{ pod, node, device string }
	want := []landing{
		{"default/urgent", "h100", "3g.40gb"}, // priority first; only H100's 3g.40gb is big enough
		{"default/m1", "h100", "1g.10gb [3,4)"},
		{"default/m2", "h100", "1g.10gb [2,3)"},
		{"default/m3", "h100", "1g.10gb"},
		{"default/shared", "core", "4000 MiB"},
		{"default/cpu", "", ""},
		{"default/too-big", "", ""},
		{"default/whole", "", ""},
	}
	if len(got) != len(want) {
		t.Fatalf("%d landings: %+v", len(got), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Pod != w.pod || g.Node != w.node || w.device != "" && (len(g.Devices) != 1 || !strings.Contains(g.Devices[0], w.device)) {
			t.Errorf("landing %d: %s on %q %v, want %s on %q with %s", i, g.Pod, g.Node, g.Devices, w.pod, w.node, w.device)
		}
	}
	if got[5].Skipped == "" || !strings.Contains(got[5].Skipped, "not a GPU pod") {
		t.Errorf("cpu: %+v", got[5])
	}
	if r := got[6].Refusal; !strings.Contains(r, "the largest device any node offers has 81152 MiB") {
		t.Errorf("too-big's refusal: %v", r)
	}
	if r := got[7].Refusals; r[string(placement.ReasonPlacementsTaken)] != 1 || r[string(placement.ReasonNoProfile)] != 1 || r[ReasonNotPreFiltered] != 1 {
		t.Errorf("whole's refusals: %v", r)
	}
	// Nothing was changed in the inputs.
	if len(existing) != 1 || nodes[0].Annotations[api.NodeInventoryAnnotation] == "" {
		t.Errorf("inputs changed")
	}
}

// TestSimulateCloseScores: under spread two equal empty nodes tie: the pick is the first,
// the other is close (kube-scheduler's other plugins decide between them); under binpack
// the first by name leads by the whole score, so nothing is close.
func TestSimulateCloseScores(t *testing.T) {
	device := config.DefaultDeviceConfig()
	nodes, leases := world(t, device, "x=A100-40GB", "y=A100-40GB")
	for nodePolicy, wantClose := range map[string]string{api.PolicySpread: "[y]", api.PolicyBinpack: "[]"} {
		pod := gpuPod("p", api.ModeMIG, "4000", "")
		pod.Annotations[api.NodeSchedulerPolicyAnnotation] = nodePolicy
		got := Simulate([]*v1.Pod{pod}, nodes, nil, leases, policy(t, device), testNow)
		if got[0].Node != "x" || fmt.Sprint(got[0].Close) != wantClose {
			t.Errorf("%s: %+v, want on x with %s close", nodePolicy, got[0], wantClose)
		}
	}
}

func TestParseNodes(t *testing.T) {
	for _, tc := range []struct {
		spec, want, err string
	}{
		{"a=2xA100-40GB+H100-80GB", "a mig [A100-40GB A100-40GB H100-80GB]", ""},
		{"b=A30-24GB:hami-core", "b hami-core [A30-24GB]", ""},
		{"c", "", `--nodes "c": want NAME=`},
		{"d=2xV100", "", `unknown GPU model "V100"`},
		{"e=A100-40GB:exclusive", "", `mode "exclusive"`},
		{"f=0xA100-40GB", "", "0 GPUs of A100-40GB"},
	} {
		got, err := ParseNodes([]string{tc.spec})
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.spec, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.spec, err)
		case fmt.Sprintf("%s %s %v", got[0].Name, got[0].Mode, got[0].Models) != tc.want:
			t.Errorf("%s: %+v, want %s", tc.spec, got[0], tc.want)
		}
	}
	if _, err := ParseNodes([]string{"a=A100-40GB", "a=A100-40GB"}); err == nil || !strings.Contains(err.Error(), "described twice") {
		t.Errorf("twice: %v", err)
	}
}

// TestExplainRelocation: with the args' relocation on, explain names the relocatable pods the
// scheduler's PostFilter would move to make room, the smallest set on one GPU, each fitting
// on another node now; a bare pod, a pod without the annotation and one of higher priority
// are never named, nor a set whose pods fit nowhere else; with relocation off, none.
func TestExplainRelocation(t *testing.T) {
	device := config.DefaultDeviceConfig()
	nodes, leases := world(t, device, "frag=A100-40GB", "other=A100-40GB")
	frag, other := gpuID(t, nodes[0], 0), gpuID(t, nodes[1], 0)
	// asking gives a bound pod the request of a 1g.5gb pod.
	asking := func(p v1.Pod) v1.Pod {
		p.Spec.Containers = gpuPod(p.Name, api.ModeMIG, "4000", "").Spec.Containers
		p.Annotations[api.VGPUModeAnnotation] = api.ModeMIG
		return p
	}
	owned := func(p v1.Pod, relocatable bool, priority int32) v1.Pod {
		p = asking(p)
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs-" + p.Name, UID: types.UID("uid-" + p.Name), Controller: ptr.To(true)}}
		if relocatable {
			p.Annotations[api.RelocatableAnnotation] = "true"
		}
		p.Spec.Priority = ptr.To(priority)
		return p
	}
	// frag: 1g.5gb at slots 1 and 5 block both 3g.20gb placements; other: a 3g.20gb and a
	// 2g.10gb leave room for a 1g.5gb only.
	otherPods := []v1.Pod{bound(t, "o3", "other", rec(other, "3g.20gb", 0, 4)), bound(t, "o2", "other", rec(other, "2g.10gb", 4, 2))}
	half := gpuPod("half", api.ModeMIG, "19000", "frag")
	for _, tc := range []struct {
		name string
		a, b v1.Pod
		full bool // other has no room left
		off  bool
		want []string
	}{
		{name: "one of two", a: owned(bound(t, "a", "frag", rec(frag, "1g.5gb", 1, 1)), true, 0), b: owned(bound(t, "b", "frag", rec(frag, "1g.5gb", 5, 1)), true, 0), want: []string{"default/b"}},
		{name: "only the relocatable", a: owned(bound(t, "a", "frag", rec(frag, "1g.5gb", 1, 1)), true, 0), b: owned(bound(t, "b", "frag", rec(frag, "1g.5gb", 5, 1)), false, 0), want: []string{"default/a"}},
		{name: "bare and higher priority", a: func() v1.Pod {
			p := bound(t, "a", "frag", rec(frag, "1g.5gb", 1, 1))
			p.Annotations[api.RelocatableAnnotation] = "true"
			return p
		}(), b: owned(bound(t, "b", "frag", rec(frag, "1g.5gb", 5, 1)), true, 10)},
		{name: "nowhere else", a: owned(bound(t, "a", "frag", rec(frag, "1g.5gb", 1, 1)), true, 0), b: owned(bound(t, "b", "frag", rec(frag, "1g.5gb", 5, 1)), true, 0), full: true},
		{name: "relocation off", a: owned(bound(t, "a", "frag", rec(frag, "1g.5gb", 1, 1)), true, 0), b: owned(bound(t, "b", "frag", rec(frag, "1g.5gb", 5, 1)), true, 0), off: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := append([]v1.Pod{tc.a, tc.b}, otherPods...)
			if tc.full {
				pods = append(pods, bound(t, "o1", "other", rec(other, "2g.10gb", 6, 2)))
			}
			pol := policy(t, device)
			pol.Args.Relocation.Enabled = !tc.off
			e, err := Explain(half, nodes, pods, leases, pol, testNow)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range e.Nodes {
				if v.Node == "frag" && !slices.Equal(v.Relocation, tc.want) {
					t.Errorf("frag: relocation %v, want %v (%s: %s)", v.Relocation, tc.want, v.Reason, v.Layout)
				}
			}
		})
	}
}
