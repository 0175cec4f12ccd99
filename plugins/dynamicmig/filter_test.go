package dynamicmig

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/dynamig/dynamig/api"
)

// TestFitCacheFollowsNodeInfoGeneration: Filter reuses a node's fit for the same request
// and NodeInfo generation, and recomputes it once a pod lands on the node or the request
// differs.
func TestFitCacheFollowsNodeInfoGeneration(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n1", api.ModeMIG, "A100-40GB")})
	filter := func(pod *v1.Pod, ni fwk.NodeInfo) *nodeFit {
		t.Helper()
		state := framework.NewCycleState()
		if _, st := e.pl.PreFilter(e.ctx, state, pod, []fwk.NodeInfo{ni}); !st.IsSuccess() {
			t.Fatal(st.AsError())
		}
		if st := e.pl.Filter(e.ctx, state, pod, ni); !st.IsSuccess() {
			t.Fatal(st.AsError())
		}
		s, _ := readState(state)
		f, _ := s.fit("n1")
		return f
	}
	ni := framework.NewNodeInfo()
	ni.SetNode(e.nodes[0])
	small := gpuPod("small", api.ModeMIG, [2]int{1, 4000})
	first := filter(small, ni)
	if again := filter(gpuPod("small-2", api.ModeMIG, [2]int{1, 4000}), ni); again != first {
		t.Errorf("same request, same generation: fit recomputed")
	}
	bound := small.DeepCopy()
	bound.Spec.NodeName = "n1"
	raw, err := api.EncodeMigReservations([]api.MigReservation{{GPUUUID: first.result.Assignments[0].GPUUUID, Profile: "1g.5gb", Placement: first.result.Assignments[0].Placement}})
	if err != nil {
		t.Fatal(err)
	}
	bound.Annotations[api.MigReservationsAnnotation] = raw
	ni.AddPod(bound)
	next := filter(gpuPod("small-3", api.ModeMIG, [2]int{1, 4000}), ni)
	if next == first || next.result.Assignments[0].Placement == first.result.Assignments[0].Placement {
		t.Errorf("after a pod landed, the fit is still %v", next.result.Assignments[0].Placement)
	}
	if other := filter(gpuPod("big", api.ModeMIG, [2]int{1, 9000}), ni); other == next || other.result.Assignments[0].Profile != "2g.10gb" {
		t.Errorf("another request got the cached fit %+v", other.result.Assignments)
	}
}

// TestPreFilterLimitsToGPUNodes: PreFilter's result is the nodes with a GPU of a mode the pod
// accepts, and those whose inventory does not decode (Filter says why they are refused); a
// node's update is seen in the next cycle; with no such node PreFilter refuses the pod,
// naming the mode; when every node has one, the result is all nodes.
func TestPreFilterLimitsToGPUNodes(t *testing.T) {
	broken := gpuNode(t, "broken", api.ModeMIG, "A100-40GB")
	broken.Annotations[api.NodeInventoryAnnotation] = "not an inventory"
	nodes := []*v1.Node{gpuNode(t, "mig", api.ModeMIG, "A100-40GB"), gpuNode(t, "hc", api.ModeHAMiCore, "A100-40GB"),
		{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}, broken}
	e := newEnv(t, nil, nodes)
	preFilter := func(pod *v1.Pod, nodes []*v1.Node) (*fwk.PreFilterResult, *fwk.Status) {
		infos, _ := cache.NewSnapshot(nil, nodes).NodeInfos().List()
		return e.pl.PreFilter(e.ctx, framework.NewCycleState(), pod, infos)
	}
	for mode, want := range map[string][]string{api.ModeMIG: {"broken", "mig"}, api.ModeHAMiCore: {"broken", "hc"}, "": {"broken", "hc", "mig"}} {
		res, st := preFilter(gpuPod("p", mode, [2]int{1, 4000}), nodes)
		if !st.IsSuccess() || res.AllNodes() || !slices.Equal(sets.List(res.NodeNames), want) {
			t.Errorf("mode %q: %v %v, want nodes %v", mode, res, st, want)
		}
	}
	// Every node has a GPU of the mode: all nodes, without a set kube-scheduler would clone.
	if res, st := preFilter(gpuPod("p", api.ModeMIG, [2]int{1, 4000}), nodes[:1]); !st.IsSuccess() || !res.AllNodes() {
		t.Errorf("only GPU nodes: %v %v, want all nodes", res, st)
	}
	// The MIG node stops publishing: the next cycle's Node object is another one.
	updated := nodes[0].DeepCopy()
	delete(updated.Annotations, api.NodeInventoryAnnotation)
	nodes[0] = updated
	if res, st := preFilter(gpuPod("p", api.ModeMIG, [2]int{1, 4000}), nodes); !st.IsSuccess() || !slices.Equal(sets.List(res.NodeNames), []string{"broken"}) {
		t.Errorf("after the MIG node's update: %v %v, want only broken", res, st)
	}
	res, st := preFilter(gpuPod("p", api.ModeMIG, [2]int{1, 4000}), nodes[:3])
	if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "no node publishes a GPU inventory with a mig GPU") {
		t.Errorf("without a MIG node: %v %v, want the pod refused, naming the mode", res, st)
	}
}
