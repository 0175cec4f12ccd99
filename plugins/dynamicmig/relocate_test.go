package dynamicmig

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
)

// holder is a pod bound to node holding one MIG instance at [start, start+size) of the
// node's first GPU: relocatable (annotated) or not, owned by ReplicaSet owner ("" for a
// bare pod), of priority.
func holder(t *testing.T, node *v1.Node, name, profile string, start, size int, relocatable bool, owner string, priority int32) *v1.Pod {
	t.Helper()
	inv, err := api.DecodeInventory(node.Annotations[api.NodeInventoryAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	p := gpuPod(name, api.ModeMIG, [2]int{1, 1})
	p.Spec.NodeName = node.Name
	p.Spec.Priority = ptr.To(priority)
	p.Labels = map[string]string{"app": name}
	raw, err := api.EncodeMigReservations([]api.MigReservation{{GPUUUID: inv[0].ID, Profile: profile, Placement: api.Placement{Start: start, Size: size}}})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations[api.MigReservationsAnnotation] = raw
	if relocatable {
		p.Annotations[api.RelocatableAnnotation] = "true"
	}
	if owner != "" {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: owner, UID: types.UID("uid-" + owner), Controller: ptr.To(true)}}
	}
	return p
}

// relocationWorld: node n's A100-40GB holds 1g.5gb pods a (slot 1) and b (slot 5), which
// block both 3g.20gb placements; node m's holds a 3g.20gb and a 2g.10gb, immovable, so one
// 1g.5gb fits there (slot 6) and no 3g.20gb. A 3g.20gb pod fits only if a or b moves.
type relocationWorld struct{ *env }

func newRelocationWorld(t *testing.T, args *config.DynamicMIGArgs, a, b *v1.Pod, objs ...runtime.Object) *relocationWorld {
	t.Helper()
	n, m := gpuNode(t, "n", api.ModeMIG, "A100-40GB"), gpuNode(t, "m", api.ModeMIG, "A100-40GB")
	objs = append(objs, a, b, holder(t, m, "m3g", "3g.20gb", 0, 4, false, "", 0), holder(t, m, "m2g", "2g.10gb", 4, 2, false, "", 0))
	return &relocationWorld{env: newEnv(t, args, []*v1.Node{n, m}, objs...)}
}

// postFilter runs a cycle of a 3g.20gb pod of priority, which fits nowhere, then
// DynamicMIG's PostFilter on the nodes' statuses, and waits for its evictions.
func (w *relocationWorld) postFilter(name string, priority int32) (*fwk.PostFilterResult, *fwk.Status) {
	w.t.Helper()
	p := gpuPod(name, api.ModeMIG, [2]int{1, 19000})
	p.Spec.Priority = ptr.To(priority)
	state, node, statuses := w.cycle(p)
	if node != "" {
		w.t.Fatalf("%s fits on %s without a relocation", name, node)
	}
	reader := framework.NewDefaultNodeToStatus()
	for n, st := range statuses {
		reader.Set(n, st)
	}
	before := relocationEvictionsCount()
	res, st := w.pl.PostFilter(w.ctx, state, p, reader)
	if st.IsSuccess() {
		waitFor(w.t.(*testing.T), func() bool { return relocationEvictionsCount() > before })
	}
	return res, st
}

func relocationEvictionsCount() float64 {
	n := 0.0
	for _, r := range []string{"evicted", "refused", "failed"} {
		n += testutil.ToFloat64(relocationEvictions.WithLabelValues(r))
	}
	return n
}

// TestRelocation: with relocation on, a 3g.20gb pod that fits nowhere is nominated to node n
// and one relocatable pod is evicted from it, the one that leaves the least fragmentation
// and fits elsewhere now; never a pod without the annotation, a bare pod, a pod of higher
// priority, one its disruption budget protects, one that fits nowhere else, or one whose
// controller's pods were relocated within the interval; and nothing with relocation off.
func TestRelocation(t *testing.T) {
	on := func() *config.DynamicMIGArgs {
		return &config.DynamicMIGArgs{Relocation: config.RelocationArgs{Enabled: true}}
	}
	n := gpuNode(t, "n", api.ModeMIG, "A100-40GB")
	a := func() *v1.Pod { return holder(t, n, "a", "1g.5gb", 1, 1, true, "rs-a", 0) }
	b := func() *v1.Pod { return holder(t, n, "b", "1g.5gb", 5, 1, true, "rs-b", 0) }

	t.Run("relocates one pod", func(t *testing.T) {
		w := newRelocationWorld(t, on(), a(), b())
		res, st := w.postFilter("p", 0)
		if !st.IsSuccess() || res == nil || res.NominatingInfo == nil || res.NominatingInfo.NominatedNodeName != "n" || res.NominatingInfo.Mode() != fwk.ModeOverride {
			t.Fatalf("PostFilter: %v, %+v; want p nominated to n", st, res)
		}
		// Either frees a 3g.20gb placement; b's [4,8) leaves the least fragmentation.
		if got := w.evictions(); !slices.Equal(got, []string{"b"}) {
			t.Errorf("evicted %v, want [b]", got)
		}
		// The Relocating event on p, the Relocated one on b.
		var got []string
		for len(got) < 2 {
			select {
			case e := <-w.events.Events:
				got = append(got, e)
			case <-time.After(5 * time.Second):
				t.Fatalf("events %v, want Relocating and Relocated", got)
			}
		}
		if !strings.Contains(got[0], "Relocating") || !strings.Contains(got[0], "default/b") || !strings.Contains(got[1], "Relocated") {
			t.Errorf("events %q", got)
		}
		// b's controller is not relocated from again within the interval: with b2, b's
		// replacement of the same controller, at b's slot, a second pod's relocation moves
		// a, not b2.
		b2 := holder(t, n, "b2", "1g.5gb", 5, 1, true, "rs-b", 0)
		if _, err := w.client.CoreV1().Pods("default").Create(w.ctx, b2, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, st := w.postFilter("q", 0); !st.IsSuccess() || !slices.Equal(w.evictions(), []string{"b", "a"}) {
			t.Errorf("a second relocation: %v, evicted %v; want a after b (b2's controller was relocated within the interval)", st, w.evictions())
		}
	})

	t.Run("within the interval", func(t *testing.T) {
		w := newRelocationWorld(t, on(), a(), b())
		// rs-b's interval ends in half a second, rs-a's in ten minutes.
		interval := config.DefaultRelocationInterval
		w.pl.relocated.mark("uid-rs-a", time.Now(), interval)
		w.pl.relocated.mark("uid-rs-b", time.Now().Add(-interval+500*time.Millisecond), interval)
		var res *fwk.PostFilterResult
		var st *fwk.Status
		if !w.activator.waitFor(t, "default/p", func() { res, st = w.postFilter("p", 0) }) {
			t.Error("p was not activated when rs-b's interval ended")
		}
		if st.IsSuccess() || res != nil || len(w.evictions()) > 0 {
			t.Fatalf("PostFilter: %v, %+v, evicted %v; want no relocation", st, res, w.evictions())
		}
		want := "(pods of ReplicaSet default/rs-a, ReplicaSet default/rs-b are not moved again within 10m0s of their last relocation)"
		if msg := st.Message(); !strings.Contains(msg, want) {
			t.Errorf("reason %q, want it to say %q", msg, want)
		}
		// Past rs-b's interval, b moves.
		if res, st := w.postFilter("p", 0); !st.IsSuccess() || res == nil || !slices.Equal(w.evictions(), []string{"b"}) {
			t.Errorf("after rs-b's interval: %v, evicted %v; want b", st, w.evictions())
		}
	})

	for _, tc := range []struct {
		name     string
		a, b     *v1.Pod
		priority int32
		objs     []runtime.Object
		args     *config.DynamicMIGArgs
	}{
		{name: "relocation off", a: a(), b: b(), args: &config.DynamicMIGArgs{}},
		{name: "not annotated", a: holder(t, n, "a", "1g.5gb", 1, 1, false, "rs-a", 0), b: holder(t, n, "b", "1g.5gb", 5, 1, false, "rs-b", 0), args: on()},
		{name: "bare pods", a: holder(t, n, "a", "1g.5gb", 1, 1, true, "", 0), b: holder(t, n, "b", "1g.5gb", 5, 1, true, "", 0), args: on()},
		{name: "higher priority", a: a(), b: b(), priority: -1, args: on()},
		{name: "disruption budgets", a: a(), b: b(), args: on(), objs: []runtime.Object{budget("a"), budget("b")}},
		{name: "nowhere else", a: a(), b: b(), args: on(), objs: []runtime.Object{holder(t, gpuNode(t, "m", api.ModeMIG, "A100-40GB"), "m1g", "1g.5gb", 6, 1, false, "", 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newRelocationWorld(t, tc.args, tc.a, tc.b, tc.objs...)
			if tc.name == "disruption budgets" {
				waitFor(t, func() bool {
					pdbs, _ := w.pl.pdbLister.List(labels.Everything())
					return len(pdbs) == 2
				})
			}
			res, st := w.postFilter("p", tc.priority)
			if st.IsSuccess() || res != nil || len(w.evictions()) > 0 {
				t.Errorf("PostFilter: %v, %+v, evicted %v; want no relocation", st, res, w.evictions())
			}
			if tc.name == "relocation off" && len(st.Reasons()) > 0 {
				t.Errorf("reasons %q: none where relocation is off (kube-scheduler adds them to every FailedScheduling message)", st.Reasons())
			}
		})
	}
}

// budget is a PodDisruptionBudget of the pod of app label app that allows no disruption.
func budget(app string) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: "default", UID: types.UID("pdb-" + app)},
		Spec:   policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0}}
}

// TestNominatedRoomHeld: the room freed for a nominated pod (its preemption's victims, the
// pods relocated for it) is held for it while they terminate, through kube-scheduler's two
// Filter passes over a node with nominated pods (first with them on a clone of the state,
// then without). Node n: GPU 0 holds 1g.5gb pods at slots 0–3 and one at slot 5 that is
// terminating; a 3g.20gb pod is nominated to n (its room: [4,8) of GPU 0 once slot 5 is
// free); GPU 1 holds one 1g.5gb pod. A 1g.5gb pod is reserved on GPU 1, not in the held room,
// although without the nominated pod binpack prefers GPU 0's slots 4 and 6.
func TestNominatedRoomHeld(t *testing.T) {
	node := gpuNode(t, "n", api.ModeMIG, "A100-40GB", "A100-40GB")
	e := newEnv(t, nil, []*v1.Node{node})
	inv, err := api.DecodeInventory(node.Annotations[api.NodeInventoryAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	var bound []*v1.Pod
	at := func(name string, gpu, slot int) *v1.Pod {
		p := holder(t, node, name, "1g.5gb", slot, 1, false, "", 0)
		raw, _ := api.EncodeMigReservations([]api.MigReservation{{GPUUUID: inv[gpu].ID, Profile: "1g.5gb", Placement: api.Placement{Start: slot, Size: 1}}})
		p.Annotations[api.MigReservationsAnnotation] = raw
		bound = append(bound, p)
		return p
	}
	for slot := range 4 {
		at("f"+string(rune('0'+slot)), 0, slot)
	}
	leaving := at("leaving", 0, 5)
	leaving.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	at("g1", 1, 0)
	e.snapshot.set(cache.NewSnapshot(bound, e.nodes))
	info, _ := e.snapshot.NodeInfos().Get("n")
	ni := info.(*framework.NodeInfo)

	nominated := gpuPod("big", api.ModeMIG, [2]int{1, 19000})
	nominated.Status.NominatedNodeName = "n"
	c := gpuPod("c", api.ModeMIG, [2]int{1, 4000})
	state := framework.NewCycleState()
	if _, st, _ := e.fw.RunPreFilterPlugins(e.ctx, state, c); !st.IsSuccess() {
		t.Fatal(st)
	}
	// kube-scheduler's addGENominatedPods, then the pass without them.
	withNominated := ni.Snapshot().(*framework.NodeInfo)
	withNominated.AddPod(nominated)
	if st := e.fw.RunFilterPlugins(e.ctx, state.Clone(), c, withNominated); !st.IsSuccess() {
		t.Fatalf("with the nominated pod: %v", st)
	}
	if st := e.fw.RunFilterPlugins(e.ctx, state, c, ni); !st.IsSuccess() {
		t.Fatalf("without it: %v", st)
	}
	if st := e.fw.RunReservePluginsReserve(e.ctx, state, c, "n"); !st.IsSuccess() {
		t.Fatal(st)
	}
	r, _ := e.pl.reservations.get(c.UID)
	if a := r.result.Assignments[0]; a.GPUUUID != inv[1].ID {
		t.Errorf("c reserved %s at %s of GPU %s: the room held for big is [4,8) of GPU %s", a.Profile, a.Placement, a.GPUUUID, inv[0].ID)
	}
}

// TestBudgetHint: with relocation on, DynamicMIG requeues a pod it refused when a disruption
// budget is deleted or allows more disruptions (the dynamic informer's objects are
// unstructured), not when it allows as many or fewer; with relocation off it does not watch
// budgets.
func TestBudgetHint(t *testing.T) {
	has := func(pl *DynamicMIG) bool {
		events, err := pl.EventsToRegister(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(events, func(e fwk.ClusterEventWithHint) bool { return e.Event.Resource == disruptionBudgets })
	}
	n := gpuNode(t, "n", api.ModeMIG, "A100-40GB")
	if has(newEnv(t, nil, []*v1.Node{n}).pl) {
		t.Error("budgets watched with relocation off")
	}
	pl := newEnv(t, &config.DynamicMIGArgs{Relocation: config.RelocationArgs{Enabled: true}}, []*v1.Node{n}).pl
	if !has(pl) {
		t.Fatal("budgets not watched with relocation on")
	}
	budget := func(allowed int64) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
			"metadata": map[string]any{"name": "web", "namespace": "default"}, "status": map[string]any{"disruptionsAllowed": allowed}}}
	}
	p := gpuPod("p", api.ModeMIG, [2]int{1, 19000})
	for _, tc := range []struct {
		name     string
		old, new any
		want     fwk.QueueingHint
	}{
		{"allows more", budget(0), budget(1), fwk.Queue},
		{"allows as many", budget(1), budget(1), fwk.QueueSkip},
		{"allows fewer", budget(1), budget(0), fwk.QueueSkip},
		{"deleted", budget(0), nil, fwk.Queue},
	} {
		if got, _ := pl.isSchedulableAfterBudgetChange(klog.Background(), p, tc.old, tc.new); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
