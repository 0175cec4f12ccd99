package allocate

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/dynamig/dynamig/api"
)

// TestUnexplained: an instance is explained by a reservation of a pod of the node that has
// not ended, at its GPU and placement; the others are listed (issue 14, defect 2).
func TestUnexplained(t *testing.T) {
	e := newEnv(t)
	make := func(profile string, pl api.Placement) {
		t.Helper()
		unlock, err := e.mgr.Lock(e.gpu)
		if err != nil {
			t.Fatal(err)
		}
		defer unlock()
		if _, err := e.mgr.Create(e.ctx, e.gpu, profile, pl); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name string, phase v1.PodPhase, nodeName string, recs ...api.MigReservation) *v1.Pod {
		raw, err := api.EncodeMigReservations(recs)
		if err != nil {
			t.Fatal(err)
		}
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{api.MigReservationsAnnotation: raw}},
			Spec: v1.PodSpec{NodeName: nodeName}, Status: v1.PodStatus{Phase: phase}}
	}
	rec := func(profile string, start, size int) api.MigReservation {
		return api.MigReservation{GPUUUID: e.gpu, Profile: profile, Placement: api.Placement{Start: start, Size: size}}
	}
	make("2g.10gb", api.Placement{Start: 0, Size: 2}) // the running pod's
	make("1g.5gb", api.Placement{Start: 4, Size: 1})  // someone else's
	make("1g.5gb", api.Placement{Start: 6, Size: 1})  // an ended pod's, kept
	make("1g.5gb", api.Placement{Start: 5, Size: 1})  // named only by a pod of another node
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, p := range []*v1.Pod{
		pod("running", v1.PodRunning, node, rec("2g.10gb", 0, 2)),
		pod("not-realised-yet", v1.PodPending, node, rec("2g.10gb", 2, 2)),
		pod("done", v1.PodSucceeded, node, rec("1g.5gb", 6, 1)),
		pod("elsewhere", v1.PodRunning, "other-node", rec("1g.5gb", 5, 1)),
	} {
		if err := indexer.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	e.a.opts.Pods = corelisters.NewPodLister(indexer)
	got, err := e.a.Unexplained(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint(map[string][]api.Instance{e.gpu: {
		{Profile: "1g.5gb", Placement: api.Placement{Start: 4, Size: 1}},
		{Profile: "1g.5gb", Placement: api.Placement{Start: 5, Size: 1}},
		{Profile: "1g.5gb", Placement: api.Placement{Start: 6, Size: 1}},
	}})
	if fmt.Sprint(got) != want {
		t.Errorf("unexplained %v, want %v", got, want)
	}
	e.a.opts.Pods = nil
	if _, err := e.a.Unexplained(e.ctx); err == nil {
		t.Error("without a pod informer the instances cannot be told apart")
	}
}

// TestUnexplainedSkipsALostGPU: a GPU NVML cannot list any more is left out, so the inventory
// can still be published (it marks the GPU unhealthy).
func TestUnexplainedSkipsALostGPU(t *testing.T) {
	e := newEnv(t)
	e.a.opts.Pods = corelisters.NewPodLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))
	e.sim.LoseGPU(0)
	if got, err := e.a.Unexplained(e.ctx); err != nil || len(got) != 0 {
		t.Errorf("lost GPU: %v, %v; want nothing and no error", got, err)
	}
}
