package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/inspect"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
)

// pinned is a GPU pod that only node's selector admits.
func pinned(name, mode string, memory int, node string) *v1.Pod {
	p := pod(name, mode, 1, memory)
	p.Spec.NodeSelector = map[string]string{v1.LabelHostname: node}
	return p
}

// explained is kubectl dynamig explain -o json.
type explained struct {
	Pod     string            `json:"pod"`
	Refusal string            `json:"refusal"`
	Nodes   []inspect.Verdict `json:"nodes"`
}

// TestExplainMatchesScheduler: for a Pending pod per reason (no profile, all placements
// taken, fragmented, instance limit, heartbeat expired, mode), kubectl dynamig explain gives
// every node the reason the scheduler counted for it in the pod's PodScheduled condition;
// and ending the pod explain names as in the way of the fragmented one lets it run there.
func TestExplainMatchesScheduler(t *testing.T) {
	// RTX PRO 6000 GPUs may only be split into 1g.24gb+me.all (which holds every media
	// engine, so only -me profiles fit beside it) and 2g.48gb.
	devCfg := filepath.Join(t.TempDir(), "device-config.yaml")
	if err := os.WriteFile(devCfg, []byte(`nvidia:
  migProfileAllowlist:
  - models: [RTX-PRO-6000-Blackwell-Server]
    profiles: [1g.24gb+me.all, 2g.48gb]
  - models: [A100-40GB]
    profiles: [1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	w := startConfig(t, sandboxconfig.Config{DeviceConfig: devCfg, Nodes: []sandboxconfig.NodeConfig{
		mig("frag", "A100-40GB"), mig("me", "RTX-PRO-6000-Blackwell-Server"), {Name: "core", Mode: api.ModeHAMiCore, GPUs: []string{"A100-40GB"}}}})
	w.staleNode("gone", "frag")

	// frag: seven 1g.5gb, then those at slots 0-2 end: slots 3-6 stay held.
	var small []string
	for i := range 7 {
		small = append(small, fmt.Sprintf("small-%d", i))
		w.Create(pinned(small[i], api.ModeMIG, 4000, "frag"))
	}
	recs := w.Running(small...)
	at := map[int]string{}
	for name, rs := range recs {
		at[rs[0].Placement.Start] = name
	}
	w.Delete(at[0], at[1], at[2])
	w.gonePods(at[0], at[1], at[2])
	w.Create(pinned("all-me", api.ModeMIG, 20000, "me"))
	if r := w.Running("all-me")["all-me"]; len(r) != 1 || r[0].Profile != "1g.24gb+me.all" {
		t.Fatalf("all-me: %v, want a 1g.24gb+me.all", r)
	}

	for _, tc := range []struct {
		pod, node, reason string
		memory            int
		mode              string
	}{
		{"huge", "frag", "no allowlisted MIG profile big enough", 45000, api.ModeMIG},
		{"larger-than-any", "frag", "the largest device any node offers has 48512 MiB", 50000, api.ModeMIG},
		{"whole", "frag", "all MIG placements taken", 39000, api.ModeMIG},
		{"half", "frag", "MIG GPU fragmented: enough free slots but no legal placement", 19000, api.ModeMIG},
		{"beside", "me", "MIG instance limit reached", 40000, api.ModeMIG},
		{"late", "gone", "node's dynamig-device-plugin heartbeat expired", 4000, api.ModeMIG},
		{"mig-on-core", "core", inspect.ReasonNotPreFiltered, 4000, api.ModeMIG},
	} {
		t.Run(tc.pod, func(t *testing.T) {
			w := &world{w.For(t)}
			w.Create(pinned(tc.pod, tc.mode, tc.memory, tc.node))
			msg := w.Pending(tc.pod)
			var got explained
			if err := json.Unmarshal([]byte(w.kubectlDynamig("explain", tc.pod, "-n", "default", "-o", "json")), &got); err != nil {
				t.Fatal(err)
			}
			if got.Refusal != "" {
				// PreFilter: one refusal for every node, counted as none.
				if !strings.Contains(got.Refusal, tc.reason) || !strings.Contains(msg, got.Refusal) {
					t.Errorf("explain: refused before any node: %q; the scheduler says %q; want %q", got.Refusal, msg, tc.reason)
				}
				return
			}
			counts := map[string]int{}
			for _, v := range got.Nodes {
				counts[v.Reason]++
				if v.Node == tc.node && v.Reason != tc.reason {
					t.Errorf("explain gives %s %q (%s), want %q", v.Node, v.Reason, v.Detail, tc.reason)
				}
			}
			if want := fmt.Sprintf("0/%d nodes are available: ", len(got.Nodes)); !strings.HasPrefix(msg, want) {
				t.Errorf("scheduler: %q, want it to start %q", msg, want)
			}
			for reason, n := range counts {
				if !strings.Contains(msg, fmt.Sprintf("%d %s", n, reason)) {
					t.Errorf("explain counts %d node(s) %q; the scheduler says %q", n, reason, msg)
				}
			}
		})
	}

	// The smallest change for half: the pod at slot 3 ends, and half runs in [0,4).
	var got explained
	if err := json.Unmarshal([]byte(w.kubectlDynamig("explain", "half", "-n", "default", "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(got.Nodes, func(v inspect.Verdict) bool { return v.Node == "frag" })
	if i < 0 || fmt.Sprint(got.Nodes[i].FitsWithout) != fmt.Sprint([][]string{{"default/" + at[3]}}) || len(got.Nodes[i].Layout) != 1 {
		t.Fatalf("frag for half: %+v, want it to fit without default/%s", got.Nodes, at[3])
	}
	if table := w.kubectlDynamig("explain", "half", "-n", "default"); !strings.Contains(table, "fits once one of these ends: default/"+at[3]) {
		t.Errorf("explain's table lacks the smallest change:\n%s", table)
	}
	w.Delete(at[3])
	if r := w.Running("half")["half"]; len(r) != 1 || r[0].Placement != (api.Placement{Start: 0, Size: 4}) {
		t.Errorf("half: %v, want 3g.20gb at [0,4)", r)
	}
}

// TestSimulateMatchesScheduler: kubectl dynamig simulate predicts, for pods not created yet,
// the node, profile, placement and GPU the scheduler then gives each, and which fit nowhere.
func TestSimulateMatchesScheduler(t *testing.T) {
	w := startConfig(t, sandboxconfig.Config{Nodes: []sandboxconfig.NodeConfig{
		mig("a100", "A100-40GB"), mig("h100", "H100-80GB"), {Name: "core", Mode: api.ModeHAMiCore, GPUs: []string{"A100-40GB"}}}})
	w.Create(pinned("old", api.ModeMIG, 19000, "a100"))
	w.Running("old")

	pods := []*v1.Pod{pod("m1", api.ModeMIG, 1, 9000), pod("m2", api.ModeMIG, 1, 9000), pod("m3", api.ModeMIG, 1, 4000),
		pod("shared", api.ModeHAMiCore, 1, 4000), pod("pair", api.ModeMIG, 2, 4000), pod("too-big", api.ModeMIG, 1, 90000), pod("whole", api.ModeMIG, 1, 70000)}
	var docs []string
	for _, p := range pods {
		p.APIVersion, p.Kind = "v1", "Pod"
		raw, err := yaml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(raw))
	}
	file := filepath.Join(t.TempDir(), "pods.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	var sim struct {
		Pods []inspect.Landing `json:"pods"`
	}
	if err := json.Unmarshal([]byte(w.kubectlDynamig("simulate", "-f", file, "-o", "json")), &sim); err != nil {
		t.Fatal(err)
	}
	if len(sim.Pods) != len(pods) {
		t.Fatalf("simulate placed %d pods: %+v", len(sim.Pods), sim.Pods)
	}
	if table := w.kubectlDynamig("simulate", "-f", file); !strings.Contains(table, "refused before any node: container \"main\" asks for nvidia.com/gpumem 90000") ||
		!strings.Contains(table, "0/3 nodes are available: 1 all MIG placements taken, 1 no allowlisted MIG profile big enough, 1 "+inspect.ReasonNotPreFiltered) {
		t.Errorf("simulate's table:\n%s", table)
	}
	for _, p := range pods {
		p.ResourceVersion = ""
		w.Create(p)
	}
	w.Running("m1", "m2", "m3", "shared", "pair")
	for _, l := range sim.Pods {
		if l.Node == "" {
			// Fits nowhere: the scheduler's Pending condition says what simulate said.
			msg := w.Pending(strings.TrimPrefix(l.Pod, "default/"))
			for reason, n := range l.Refusals {
				if !strings.Contains(msg, fmt.Sprintf("%d %s", n, reason)) {
					t.Errorf("%s: simulate counts %d node(s) %q; the scheduler says %q", l.Pod, n, reason, msg)
				}
			}
			if l.Refusal != "" && !strings.Contains(msg, l.Refusal) {
				t.Errorf("%s: simulate says %q; the scheduler says %q", l.Pod, l.Refusal, msg)
			}
			continue
		}
		name := strings.TrimPrefix(l.Pod, "default/")
		p := w.Get(name)
		if p.Spec.NodeName != l.Node {
			t.Errorf("%s: simulate said node %q, the scheduler chose %q", name, l.Node, p.Spec.NodeName)
		}
		if len(l.Close) > 0 {
			t.Errorf("%s: simulate found nodes as close as %s (%v): the test wants clear choices", name, l.Node, l.Close)
		}
		var got []string
		if raw, ok := p.Annotations[api.MigReservationsAnnotation]; ok {
			recs, err := api.DecodeMigReservations(raw)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				got = append(got, fmt.Sprintf("container %d device %d: %s %s on %s", r.ContainerIndex, r.DeviceIndex, r.Profile, r.Placement, r.GPUUUID))
			}
		}
		if raw, ok := p.Annotations[api.DevicesAllocatedAnnotation]; ok {
			cs, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, raw)
			if err != nil {
				t.Fatal(err)
			}
			for ci, c := range cs {
				for di, d := range c {
					got = append(got, fmt.Sprintf("container %d device %d: %d MiB %d%% of %s", ci, di, d.MemoryMiB, d.Cores, d.UUID))
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(l.Devices) {
			t.Errorf("%s: simulate said %v, the scheduler reserved %v", name, l.Devices, got)
		}
	}
}

// gonePods waits until the pods' objects are gone from the API.
func (w *world) gonePods(names ...string) {
	w.T.Helper()
	w.WaitFor(strings.Join(names, ", ")+" deleted", 60*time.Second, func() (bool, string) {
		for _, n := range names {
			if _, err := w.C.CoreV1().Pods("default").Get(w.Ctx, n, metav1.GetOptions{}); err == nil {
				return false, n + " still exists"
			}
		}
		return true, ""
	})
}

// staleNode adds a Node without a kubelet that publishes like's inventory and whose
// heartbeat Lease was last renewed an hour ago: its device plugin stopped.
func (w *world) staleNode(name, like string) {
	w.T.Helper()
	src, err := w.C.CoreV1().Nodes().Get(w.Ctx, like, metav1.GetOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelHostname: name},
		Annotations: map[string]string{api.NodeInventoryAnnotation: src.Annotations[api.NodeInventoryAnnotation]}}}
	n, err = w.C.CoreV1().Nodes().Create(w.Ctx, n, metav1.CreateOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	n.Status.Capacity = v1.ResourceList{v1.ResourceCPU: resource.MustParse("8"), v1.ResourceMemory: resource.MustParse("32Gi"),
		v1.ResourcePods: resource.MustParse("110"), api.ResourceCount: resource.MustParse("7")}
	n.Status.Allocatable = n.Status.Capacity
	if _, err := w.C.CoreV1().Nodes().UpdateStatus(w.Ctx, n, metav1.UpdateOptions{}); err != nil {
		w.T.Fatal(err)
	}
	renewed := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	if _, err := w.C.CoordinationV1().Leases(api.DefaultSystemNamespace).Create(w.Ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeaseName(name)},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), RenewTime: &renewed, LeaseDurationSeconds: ptr.To[int32](40)},
	}, metav1.CreateOptions{}); err != nil {
		w.T.Fatal(err)
	}
}

// TestUnexplainedInstancesAreTaken: MIG instances someone else made on a node (no pod, no
// checkpoint entry) are published with the inventory, and the scheduler reserves nothing
// that overlaps them: a pod that only fits there stays Pending for that reason, which the
// slot map shows, instead of being bound to a placement it can never get (issue 14, defect
// 2). A smaller pod runs beside them.
func TestUnexplainedInstancesAreTaken(t *testing.T) {
	w := start(t, mig("n", "A100-40GB"))
	for _, pl := range []api.Placement{{Start: 0, Size: 4}, {Start: 4, Size: 2}} {
		profile := map[int]string{4: "3g.20gb", 2: "2g.10gb"}[pl.Size]
		if err := w.SB.MakeInstance(w.Ctx, "n", 0, profile, pl); err != nil {
			t.Fatal(err)
		}
	}
	// The device plugin publishes them within its inventory interval (30 s).
	w.WaitFor("the inventory to list the two instances", 45*time.Second, func() (bool, string) {
		n, err := w.C.CoreV1().Nodes().Get(w.Ctx, "n", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		gpus, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
		if err != nil || len(gpus) != 1 {
			return false, fmt.Sprint(gpus, err)
		}
		return len(gpus[0].Unexplained) == 2, fmt.Sprintf("unexplained: %v", gpus[0].Unexplained)
	})
	w.Create(pod("half", api.ModeMIG, 1, 19000))
	if msg := w.Pending("half"); !strings.Contains(msg, "1 all MIG placements taken") {
		t.Errorf("half: %q, want all placements taken", msg)
	}
	if nodes := w.kubectlDynamig("nodes", "n"); !strings.Contains(nodes, "|x x x x x x . .|") {
		t.Errorf("kubectl dynamig nodes does not show the unexplained instances:\n%s", nodes)
	}
	w.Create(pod("small", api.ModeMIG, 1, 4000))
	if r := w.Running("small")["small"]; len(r) != 1 || r[0].Placement != (api.Placement{Start: 6, Size: 1}) {
		t.Errorf("small: %v, want a 1g.5gb at [6,7), the one free placement", r)
	}
}
