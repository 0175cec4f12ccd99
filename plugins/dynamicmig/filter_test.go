package dynamicmig

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
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
