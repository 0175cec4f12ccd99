package workloads

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/manifests"
	"github.com/dynamig/dynamig/test/cluster/controllermanager"
	"github.com/dynamig/dynamig/test/sandbox"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
	"github.com/dynamig/dynamig/test/sandbox/sandboxtest"
)

// Memory asked for each profile of an A100-40GB.
const (
	mem1g = 4000
	mem2g = 9000
	mem3g = 19000
	mem7g = 39000
)

// TestRelocation, with relocation on (chart values scheduler.relocation): node n1 has three
// A100-40GB, each with its 3g.20gb placements blocked, [0,4) by bare 1g.5gb pods and [4,8) by
// one 1g.5gb pod at slot 5: on GPU 0 a bare pod annotated relocatable, on GPU 1 a Deployment's
// pod annotated relocatable whose disruption budget allows no eviction, on GPU 2 a
// Deployment's pod without the annotation. n2 has room for a 1g.5gb, none for a 3g.20gb. A
// 3g.20gb pod waits, and none of the three is moved. Once the budget goes, one relocation
// round evicts the Deployment's pod from GPU 1, the 3g.20gb pod runs in its room, and the
// Deployment's pod runs again elsewhere; the other two are never moved, and nothing is
// evicted twice. Then the half GPU where the Deployment's new pod runs is cleared of all but
// it, and a second 3g.20gb pod waits: the Deployment's pods are not moved again within the
// interval (40 s here), and are when it ends. Nothing but the budget's deletion and the
// interval's end retries the waiting pods.
func TestRelocation(t *testing.T) {
	const interval = 40 * time.Second
	rendered, err := manifests.Render(manifests.Namespace, map[string]any{"createNamespace": true,
		"scheduler": map[string]any{"relocation": map[string]any{"enabled": true, "interval": interval.String()}}})
	if err != nil {
		t.Fatal(err)
	}
	install := filepath.Join(t.TempDir(), "install.yaml")
	if err := os.WriteFile(install, rendered, 0o600); err != nil {
		t.Fatal(err)
	}
	nodes := []sandboxconfig.NodeConfig{
		{Name: "n1", Mode: api.ModeMIG, GPUs: []string{a100, a100, a100}},
		{Name: "n2", Mode: api.ModeMIG, GPUs: []string{a100}},
	}
	w := &world{sandboxtest.Start(t, sandbox.Options{Config: sandboxconfig.Config{Nodes: nodes}, Install: install,
		Controllers: controllermanager.Start}, 3*time.Minute)}
	gpus := w.gpus("n1")
	evictedBefore := w.evictions() // the scheduler's metrics are the process's

	// n2 full while the holders are placed; n1's GPUs full of bare 1g.5gb pods.
	w.Create(pinned("n2-full", "n2", mem7g))
	slots := map[string]map[int]string{} // GPU → slot → pod
	for g, uuid := range gpus {
		var names []string
		for k := range 7 {
			p := pinned(fmt.Sprintf("f%d-%d", g, k), "n1", mem1g, api.UseGPUUUIDAnnotation, uuid)
			w.Create(p)
			names = append(names, p.Name)
		}
		slots[uuid] = map[int]string{}
		for name, recs := range w.Running(names...) {
			slots[uuid][recs[0].Placement.Start] = name
		}
	}
	// Each holder takes the one 1g.5gb room there is: slot 5 of its GPU.
	holders := map[string]string{} // holder → GPU
	for g, holder := range []func(){
		func() {
			w.Create(sandboxtest.GPUPod("bare", "mig", 1, mem1g, api.RelocatableAnnotation, "true"))
		},
		func() {
			d := sandbox.MIGDeployment("default", "guarded", 1, mem1g)
			d.Spec.Template.Annotations[api.RelocatableAnnotation] = "true"
			if _, err := w.C.AppsV1().Deployments("default").Create(w.Ctx, d, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: "default"},
				Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: d.Spec.Selector}}
			if _, err := w.C.PolicyV1().PodDisruptionBudgets("default").Create(w.Ctx, pdb, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		func() {
			if _, err := w.C.AppsV1().Deployments("default").Create(w.Ctx, sandbox.MIGDeployment("default", "plain", 1, mem1g), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		},
	} {
		w.Delete(slots[gpus[g]][5])
		w.Gone("n1", slots[gpus[g]][5])
		holder()
		var name string
		w.WaitFor(fmt.Sprintf("the holder of GPU %d running", g), 2*time.Minute, func() (bool, string) {
			name = w.runningOn(gpus[g], 5)
			return name != "", "no pod at slot 5"
		})
		holders[name] = gpus[g]
	}
	// [4,8) of each GPU holds only its holder; n2 has room for a 1g.5gb, none for a 3g.20gb.
	for _, uuid := range gpus {
		w.Delete(slots[uuid][4], slots[uuid][6])
	}
	w.Delete("n2-full")
	w.Gone("n2", "n2-full")
	w.Create(pinned("n2-3g", "n2", mem3g), pinned("n2-2g", "n2", mem2g))
	w.Running("n2-3g", "n2-2g")
	w.WaitFor("the budget computed", time.Minute, func() (bool, string) {
		pdb, err := w.C.PolicyV1().PodDisruptionBudgets("default").Get(w.Ctx, "guarded", metav1.GetOptions{})
		return err == nil && pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.CurrentHealthy == 1, fmt.Sprintf("%+v, %v", pdb.Status, err)
	})
	uids := w.uids(holders)

	w.Create(sandboxtest.GPUPod("big", "mig", 1, mem3g))
	w.Pending("big")
	w.noRelocation(10*time.Second, "big", uids)

	// The budget goes: that alone retries "big" (DynamicMIG's queueing hint on budgets).
	if err := w.C.PolicyV1().PodDisruptionBudgets("default").Delete(w.Ctx, "guarded", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	recs := w.Running("big")["big"]
	if len(recs) != 1 || recs[0].GPUUUID != gpus[1] || recs[0].Profile != "3g.20gb" {
		t.Fatalf("big got %v, want a 3g.20gb on GPU 1 (%s), where the relocatable pod was", recs, gpus[1])
	}
	if !w.hasEvent("big", "Relocating") {
		t.Error("big has no Relocating event")
	}
	relocated := w.eventTime("big", "Relocating")
	moved := ""
	for name, uuid := range holders {
		if uuid == gpus[1] {
			moved = name
		}
	}
	again := w.guardedRunning(moved)
	delete(uids, moved)
	w.noRelocation(5*time.Second, "", uids)
	if n := w.evictions() - evictedBefore; n != 1 {
		t.Errorf("%v relocation evictions, want 1", n)
	}

	// The half GPU of the Deployment's new pod keeps only it (the other pods there go, bare
	// ones deleted, a Deployment's scaled to 0); a second 3g.20gb pod waits.
	mine := w.runningReservations()[again]
	if len(mine) != 1 {
		t.Fatalf("%s holds %v, want one 1g.5gb", again, mine)
	}
	half := mine[0].Placement.Start / 4 * 4 // [0,4) or [4,8): a 3g.20gb's placements
	node := w.Get(again).Spec.NodeName
	for name, rs := range w.runningReservations() {
		for _, r := range rs {
			if name == again || r.GPUUUID != mine[0].GPUUUID || r.Placement.Start >= half+4 || r.Placement.Start+r.Placement.Size <= half {
				continue
			}
			if p := w.Get(name); metav1.GetControllerOf(p) == nil {
				w.Delete(name)
			} else if app := p.Labels["app"]; app == "guarded" {
				t.Fatalf("%s shares [%d,%d) of GPU %s with %s", name, half, half+4, r.GPUUUID, again)
			} else if _, err := w.C.AppsV1().Deployments("default").UpdateScale(w.Ctx, app,
				&autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: "default"}}, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			w.Gone(node, name)
		}
	}
	w.Create(sandboxtest.GPUPod("big2", "mig", 1, mem3g))
	if msg := w.Pending("big2"); !strings.Contains(msg, "are not moved again within "+interval.String()) {
		t.Errorf("big2: %q, want the reason to say the Deployment's pods are not moved again within %v", msg, interval)
	}
	w.noRelocation(time.Until(relocated.Add(interval-2*time.Second)), "big2", w.uids(map[string]string{again: ""}))
	// The interval's end alone retries "big2" (no cluster event does).
	recs2 := w.Running("big2")["big2"]
	if len(recs2) != 1 || recs2[0].GPUUUID != mine[0].GPUUUID || recs2[0].Placement.Start != half {
		t.Fatalf("big2 got %v, want a 3g.20gb at [%d,%d) of GPU %s, where %s was", recs2, half, half+4, mine[0].GPUUUID, again)
	}
	if second := w.eventTime("big2", "Relocating"); second.Sub(relocated) < interval {
		t.Errorf("the Deployment's pods were relocated again %v after the first time, within the interval %v", second.Sub(relocated), interval)
	} else if second.Sub(relocated) > interval+15*time.Second {
		t.Errorf("the Deployment's pods were relocated again %v after the first time: big2 was not tried when the interval %v ended", second.Sub(relocated), interval)
	} else {
		t.Logf("the Deployment's pods relocated again %v after the first time (interval %v)", second.Sub(relocated).Round(time.Millisecond), interval)
	}
	w.guardedRunning(again)
	if n := w.evictions() - evictedBefore; n != 2 {
		t.Errorf("%v relocation evictions, want 2", n)
	}
}

// guardedRunning waits for a pod of the guarded Deployment other than moved to run, and
// returns its name.
func (w *world) guardedRunning(moved string) string {
	w.T.Helper()
	var name string
	w.WaitFor("the guarded Deployment's pod running again, elsewhere", 2*time.Minute, func() (bool, string) {
		pods, err := w.C.CoreV1().Pods("default").List(w.Ctx, metav1.ListOptions{LabelSelector: "app=guarded"})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Name != moved && p.Status.Phase == v1.PodRunning && p.DeletionTimestamp == nil {
				name = p.Name
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items))
	})
	return name
}

// pinned is a bare pod asking for one MIG device of memory MiB on node.
func pinned(name, node string, memory int, annotations ...string) *v1.Pod {
	p := sandboxtest.GPUPod(name, "mig", 1, memory, annotations...)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	return p
}

// gpus are the UUIDs of node's GPUs, in index order, from its inventory.
func (w *world) gpus(node string) []string {
	w.T.Helper()
	n, err := w.C.CoreV1().Nodes().Get(w.Ctx, node, metav1.GetOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	inv, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
	if err != nil {
		w.T.Fatal(err)
	}
	out := make([]string, len(inv))
	for i, g := range inv {
		out[i] = g.ID
	}
	return out
}

// runningOn is the pod running with a realised instance at slot start of the GPU, or "".
func (w *world) runningOn(gpu string, start int) string {
	for name, recs := range w.runningReservations() {
		for _, r := range recs {
			if r.GPUUUID == gpu && r.Placement.Start == start {
				return name
			}
		}
	}
	return ""
}

// runningReservations are the reservations of the pods running and not ending, all realised.
func (w *world) runningReservations() map[string][]api.MigReservation {
	pods, err := w.C.CoreV1().Pods("default").List(w.Ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	out := map[string][]api.MigReservation{}
next:
	for _, p := range pods.Items {
		recs, err := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
		if err != nil || len(recs) == 0 || p.Status.Phase != v1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		for _, r := range recs {
			if !r.Realized() {
				continue next
			}
		}
		out[p.Name] = recs
	}
	return out
}

// eventTime is when the pod's first event of reason happened.
func (w *world) eventTime(pod, reason string) time.Time {
	w.T.Helper()
	evs, err := w.C.CoreV1().Events("default").List(w.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		w.T.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason != reason {
			continue
		}
		if !e.EventTime.IsZero() {
			return e.EventTime.Time
		}
		return e.FirstTimestamp.Time
	}
	w.T.Fatalf("%s has no %s event", pod, reason)
	return time.Time{}
}

// uids are the pods' UIDs now.
func (w *world) uids(pods map[string]string) map[string]types.UID {
	out := map[string]types.UID{}
	for name := range pods {
		out[name] = w.Get(name).UID
	}
	return out
}

// noRelocation asserts for hold that none of the pods is evicted or replaced and, unless
// pod is "", that pod gets no Relocating event.
func (w *world) noRelocation(hold time.Duration, pod string, uids map[string]types.UID) {
	w.T.Helper()
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		for name, uid := range uids {
			p, err := w.C.CoreV1().Pods("default").Get(w.Ctx, name, metav1.GetOptions{})
			if err != nil || p.UID != uid || p.DeletionTimestamp != nil {
				w.T.Fatalf("%s was relocated (%v)", name, err)
			}
		}
		if pod != "" && w.hasEvent(pod, "Relocating") {
			w.T.Fatalf("%s got a Relocating event", pod)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// hasEvent says whether the pod has an event of reason.
func (w *world) hasEvent(pod, reason string) bool {
	evs, err := w.C.CoreV1().Events("default").List(w.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return false
	}
	for _, e := range evs.Items {
		if e.Reason == reason {
			return true
		}
	}
	return false
}

// evictions is the scheduler's dynamig_scheduler_relocation_evictions_total{result="evicted"}
// (0 before the first).
func (w *world) evictions() float64 {
	w.T.Helper()
	v, _ := w.SchedulerSample("dynamig_scheduler_relocation_evictions_total", map[string]string{"result": "evicted"})
	return v
}
