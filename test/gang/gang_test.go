// Package gang runs DynamicMIG under kube-scheduler's gang scheduling (the Workload API,
// beta in Kubernetes 1.37, gate GenericWorkload) on the sandbox: its own package because
// feature gates are the process's, and every sandbox of this one serves PodGroups.
//
// PodGroups and the pods' spec.schedulingGroup are written as unstructured objects, so that
// the package builds on every minor's API types; the tests skip before 1.37.
package gang

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/dynamic"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/manifests"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/test/sandbox"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
	"github.com/dynamig/dynamig/test/sandbox/sandboxtest"
	"github.com/dynamig/dynamig/version"
)

func TestMain(m *testing.M) { sandboxtest.Main(m, nil) }

// The Workload API as a 1.37 cluster serves it once its admin turns it on, as
// docs/operations.md (gangs) says.
var workloadAPIFlags = []string{"--feature-gates=GenericWorkload=true", "--runtime-config=scheduling.k8s.io/v1beta1=true"}

var podGroups = schema.GroupVersionResource{Group: "scheduling.k8s.io", Version: "v1beta1", Resource: "podgroups"}

type world struct {
	sandboxtest.World
	dyn dynamic.Interface
}

// start starts a sandbox of MIG nodes of one A100-40GB each, with the Workload API served
// and dynamig installed from the chart as `helm install` renders it on such a cluster
// (scheduler.gangScheduling auto, PodGroups among the cluster's APIs).
func start(t *testing.T, nodes ...string) *world {
	t.Helper()
	release, err := version.KubernetesRelease() // what the sandbox runs
	if err != nil {
		t.Fatal(err)
	}
	if v, err := utilversion.ParseGeneric(release); err != nil {
		t.Fatal(err)
	} else if v.LessThan(utilversion.MajorMinor(1, 37)) {
		t.Skipf("the Workload API is beta from Kubernetes 1.37; this build is %s", release)
	}
	rendered, err := manifests.RenderFor(release, manifests.Namespace, manifests.InstallValues(), "scheduling.k8s.io/v1beta1/PodGroup")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rendered), "--feature-gates=GenericWorkload=true") {
		t.Fatal("the chart rendered for a cluster serving PodGroups does not turn the scheduler's GenericWorkload gate on")
	}
	file := filepath.Join(t.TempDir(), "install.yaml")
	if err := os.WriteFile(file, rendered, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := sandboxconfig.Config{}
	for _, n := range nodes {
		cfg.Nodes = append(cfg.Nodes, sandboxconfig.NodeConfig{Name: n, Mode: api.ModeMIG, GPUs: []string{"A100-40GB"}})
	}
	w := &world{World: sandboxtest.Start(t, sandbox.Options{Config: cfg, Install: file, APIServerFlags: workloadAPIFlags}, 2*time.Minute)}
	if w.dyn, err = dynamic.NewForConfig(w.SB.RestConfig()); err != nil {
		t.Fatal(err)
	}
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: lowPriorityClass}, Value: -10}
	if _, err := w.C.SchedulingV1().PriorityClasses().Create(w.Ctx, pc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return w
}

// apply creates the objects of an example file (a PodGroup and its pods), as `kubectl
// create -f` would, in namespace default, and returns the pods' names.
func (w *world) apply(file string) []string {
	w.T.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		w.T.Fatal(err)
	}
	objs, err := manifests.Objects(data)
	if err != nil {
		w.T.Fatal(err)
	}
	var pods []string
	for _, o := range objs {
		gvr := podGroups
		if o.GetKind() == "Pod" {
			gvr = v1.SchemeGroupVersion.WithResource("pods")
			pods = append(pods, o.GetName())
		}
		created, err := w.dyn.Resource(gvr).Namespace("default").Create(w.Ctx, o, metav1.CreateOptions{})
		if err != nil {
			w.T.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if _, ok, _ := unstructured.NestedString(created.Object, "spec", "schedulingGroup", "podGroupName"); o.GetKind() == "Pod" && !ok {
			w.T.Fatalf("the API server dropped pod %s's spec.schedulingGroup: is the GenericWorkload gate on?", o.GetName())
		}
	}
	return pods
}

// holdsNothing asserts, for hold, that none of the pods is bound or carries a reservation,
// that the scheduler holds no reservation in memory, and that the nodes' NVML holds only
// the instances of the pods in others.
func (w *world) holdsNothing(hold time.Duration, pods []string, nodes []string, others map[string]bool) {
	w.T.Helper()
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		for _, n := range pods {
			p := w.Get(n)
			if p.Spec.NodeName != "" || p.Annotations[api.MigReservationsAnnotation] != "" {
				w.T.Fatalf("%s of the gang was bound to %q with reservation %q while the gang cannot fit whole", n, p.Spec.NodeName, p.Annotations[api.MigReservationsAnnotation])
			}
		}
		if v := w.schedulerGauge("dynamig_scheduler_reservations_in_flight"); v != 0 {
			w.T.Fatalf("the scheduler holds %v reservations in flight while the gang waits", v)
		}
		for _, node := range nodes {
			for pod, ins := range w.Instances(node) {
				if !others[pod] {
					w.T.Fatalf("node %s has instances of %s: %v", node, pod, ins)
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// schedulerGauge is an unlabelled gauge of the scheduler's DynamicMIG metrics, scraped.
func (w *world) schedulerGauge(name string) float64 {
	w.T.Helper()
	v, ok := w.SchedulerSample(name, nil)
	if !ok {
		w.T.Fatalf("the scheduler's scrape has no %s", name)
	}
	return v
}

// TestGangAllOrNothing: a gang of 4 pods of 3g.20gb on two A100-40GB nodes with room for only
// 3 (a 3g.20gb pod holds the fourth place) stays wholly Pending: no pod bound, no reservation
// held in the scheduler or on a pod, no instance created. When the holder goes, a single
// 3g.20gb pod of lower priority is created at once and competes for the room: the gang binds
// whole either way, the single pod finding no room where the gang came first, or preempted by
// it where the single pod came first (the gang backing off); never two pods on one placement,
// and NVML holds exactly what the pods were reserved.
func TestGangAllOrNothing(t *testing.T) {
	nodes := []string{"n1", "n2"}
	w := start(t, nodes...)
	w.Create(sandboxtest.GPUPod("holder", "mig", 1, 19000))
	held := w.Running("holder")["holder"]
	if len(held) != 1 || held[0].Profile != "3g.20gb" {
		t.Fatalf("holder got %v, want one 3g.20gb", held)
	}
	gang := w.apply("../../examples/gang/train.yaml")
	if len(gang) != 4 {
		t.Fatalf("the example's pods: %v, want 4", gang)
	}
	for _, n := range gang {
		if msg := w.Pending(n); msg == "" {
			t.Fatalf("%s: no reason given", n)
		}
	}
	w.holdsNothing(5*time.Second, gang, nodes, map[string]bool{"holder": true})

	w.Delete("holder")
	w.Create(w.lowPriority(sandboxtest.GPUPod("single", "mig", 1, 19000)))
	recs := w.Running(gang...)
	if p, err := w.C.CoreV1().Pods("default").Get(w.Ctx, "single", metav1.GetOptions{}); err == nil {
		if p.Spec.NodeName != "" {
			t.Errorf("single is bound to %s beside the whole gang", p.Spec.NodeName)
		} else if msg := w.Pending("single"); !strings.Contains(msg, string(placement.ReasonPlacementsTaken)) {
			t.Errorf("single: %q, want DynamicMIG's %q: the gang holds the room", msg, placement.ReasonPlacementsTaken)
		}
		t.Log("the gang came first; the single pod finds no room")
	} else if apierrors.IsNotFound(err) {
		t.Log("the single pod came first; the gang preempted it")
	} else {
		t.Fatal(err)
	}
	w.runsWhole(gang, recs, nodes)
}

// TestGangHoldsItsRoom: a gang's placements are held from its Reserve until it is bound. On
// two A100-40GB nodes with room for exactly the gang of 4 × 3g.20gb, a webhook on
// pods/binding holds the gang's bindings (the scheduler's binding cycles wait on the API
// server, every member reserved) while a single 3g.20gb pod of lower priority is created and
// tried: it finds no room, DynamicMIG's refusal, with the 4 reservations in flight. Released,
// the gang binds whole on what it reserved, and the single pod stays Pending, unbound.
func TestGangHoldsItsRoom(t *testing.T) {
	nodes := []string{"n1", "n2"}
	w := start(t, nodes...)
	gate := w.holdBindings("train-")
	gang := w.apply("../../examples/gang/train.yaml")
	w.WaitFor("the gang's bindings at the gate", time.Minute, func() (bool, string) {
		return len(gate.held()) > 0, "none yet"
	})
	w.Create(w.lowPriority(sandboxtest.GPUPod("single", "mig", 1, 19000)))
	msg := w.Pending("single")
	for _, n := range gang {
		if p := w.Get(n); p.Spec.NodeName != "" {
			t.Fatalf("%s is bound to %s before the gate opened: the single pod was not tried inside the gang's hold", n, p.Spec.NodeName)
		}
	}
	if v := w.schedulerGauge("dynamig_scheduler_reservations_in_flight"); v != 4 {
		t.Errorf("%v reservations in flight while the gang's bindings are held, want 4", v)
	}
	if !strings.Contains(msg, string(placement.ReasonPlacementsTaken)) {
		t.Errorf("single: %q, want DynamicMIG's %q: the gang holds the room", msg, placement.ReasonPlacementsTaken)
	}
	t.Logf("tried while the gang's %d bindings were held: %s", len(gate.held()), msg)
	gate.open()
	recs := w.Running(gang...)
	w.runsWhole(gang, recs, nodes)
	if p := w.Get("single"); p.Spec.NodeName != "" {
		t.Errorf("single is bound to %s beside the whole gang", p.Spec.NodeName)
	}
}

// lowPriorityClass is a priority class below the default's, which start creates: the API
// server's priority admission knows it by the time a test creates a pod of it.
const lowPriorityClass = "low"

// lowPriority gives the pod lowPriorityClass, so that it can preempt nothing.
func (w *world) lowPriority(p *v1.Pod) *v1.Pod {
	p.Spec.PriorityClassName = lowPriorityClass
	return p
}

// runsWhole asserts that the gang runs two pods per node, without overlap, NVML holding
// exactly what each was reserved, and that the scheduler holds no reservation after.
func (w *world) runsWhole(gang []string, recs map[string][]api.MigReservation, nodes []string) {
	w.T.Helper()
	sandboxtest.NoOverlap(w.T, recs)
	byNode := map[string]map[string][]api.MigReservation{}
	for _, n := range gang {
		node := w.Get(n).Spec.NodeName
		if byNode[node] == nil {
			byNode[node] = map[string][]api.MigReservation{}
		}
		byNode[node][n] = recs[n]
	}
	for _, node := range nodes {
		if len(byNode[node]) != 2 {
			w.T.Errorf("node %s runs %d pods of the gang, want 2 (one A100-40GB holds two 3g.20gb)", node, len(byNode[node]))
		}
		w.SameHardware(node, byNode[node])
	}
	w.WaitFor("no reservation in flight", 30*time.Second, func() (bool, string) {
		v := w.schedulerGauge("dynamig_scheduler_reservations_in_flight")
		return v == 0, fmt.Sprintf("%v in flight", v)
	})
}
