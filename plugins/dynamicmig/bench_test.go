package dynamicmig

import (
	"crypto/ed25519"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"

	"github.com/dynamig/dynamig/api"
)

// BenchmarkCycle1000Nodes is DynamicMIG's share of one scheduling cycle of a one-slice MIG
// pod on 1000 nodes of 8 A100-40GB, each holding one pod already: PreFilter, Filter on every
// node, PreScore, Score and NormalizeScore, as kube-scheduler runs them for a GPU pod (never
// batched). The fits are cached after the first cycle, as they are in a scheduler whose
// nodes did not change since the previous pod.
func BenchmarkCycle1000Nodes(b *testing.B) {
	node := gpuNode(b, "template", api.ModeMIG, "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB")
	var nodes []*v1.Node
	for i := range 1000 {
		n := node.DeepCopy()
		n.Name = fmt.Sprintf("node-%04d", i)
		nodes = append(nodes, n)
	}
	e := newEnv(b, nil, nodes)
	var bound []*v1.Pod
	for i, n := range nodes {
		if i%2 == 0 {
			continue
		}
		p := gpuPod(fmt.Sprintf("held-%d", i), api.ModeMIG, [2]int{1, 4000})
		p.Spec.NodeName = n.Name
		bound = append(bound, p)
	}
	e.snapshot.set(cache.NewSnapshot(bound, nodes))
	infos, _ := e.snapshot.NodeInfos().List()
	pod := gpuPod("p", api.ModeMIG, [2]int{1, 4000})
	cycle := func() {
		state := framework.NewCycleState()
		if _, st, _ := e.fw.RunPreFilterPlugins(e.ctx, state, pod); !st.IsSuccess() {
			b.Fatal(st)
		}
		feasible := make([]fwk.NodeInfo, 0, len(infos))
		for _, ni := range infos {
			if st := e.pl.Filter(e.ctx, state, pod, ni); st.IsSuccess() {
				feasible = append(feasible, ni)
			}
		}
		if st := e.pl.PreScore(e.ctx, state, pod, feasible); !st.IsSuccess() {
			b.Fatal(st)
		}
		scores := make(fwk.NodeScoreList, len(feasible))
		for i, ni := range feasible {
			s, st := e.pl.Score(e.ctx, state, pod, ni)
			if !st.IsSuccess() {
				b.Fatal(st)
			}
			scores[i] = fwk.NodeScore{Name: ni.Node().Name, Score: s}
		}
		if st := e.pl.NormalizeScore(e.ctx, state, pod, scores); !st.IsSuccess() {
			b.Fatal(st)
		}
	}
	cycle() // decodes every node's inventory and fills the fit cache
	b.ResetTimer()
	for range b.N {
		cycle()
	}
}

// BenchmarkFitFilterGPUPod is NodeResourcesFit's Filter of a GPU pod (one device of 4000
// MiB, one cpu) on one node with the chart's args: with the GPU request's names in Fit's
// request, as kube-scheduler computes it, and after DynamicMIG's PreFilter took them out
// (takeFitRequest), with DynamicMIG's check of the device count that replaces Fit's
// (fitsDeviceCount). A scheduling cycle runs it once per node it filters.
func BenchmarkFitFilterGPUPod(b *testing.B) {
	node := gpuNode(b, "n", api.ModeMIG, "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB")
	e := newEnv(b, nil, []*v1.Node{node})
	ni := framework.NewNodeInfo()
	ni.SetNode(node)
	plugin, err := noderesources.NewFit(e.ctx, chartFitArgs(), e.fw, feature.Features{})
	if err != nil {
		b.Fatal(err)
	}
	fit := plugin.(interface {
		fwk.PreFilterPlugin
		fwk.FilterPlugin
	})
	pod := withRequests(gpuPod("p", api.ModeMIG, [2]int{1, 4000}), "1")
	for _, take := range []bool{false, true} {
		name := "names in Fit's request"
		if take {
			name = "names taken"
		}
		b.Run(name, func(b *testing.B) {
			state := framework.NewCycleState()
			if _, st := fit.PreFilter(e.ctx, state, pod, nil); !st.IsSuccess() {
				b.Fatal(st)
			}
			var devices int64
			if take {
				devices = e.pl.takeFitRequest(state)
			}
			b.ResetTimer()
			for range b.N {
				if st := fit.Filter(e.ctx, state, pod, ni); !st.IsSuccess() {
					b.Fatal(st)
				}
				if st := e.pl.fitsDeviceCount(devices, ni); !st.IsSuccess() {
					b.Fatal(st)
				}
			}
		})
	}
}

// BenchmarkBatchedGPUPod is DynamicMIG's share of one GPU pod that opportunistic batching
// places on the node the previous pod's ranking hinted: PreFilter, SignPod, Filter of that
// one node (whose generation the previous pod's binding changed, so not cached), Reserve and
// the Binding's signed annotations, on a node of 8 A100-40GB already holding 24 one-slice
// pods.
func BenchmarkBatchedGPUPod(b *testing.B) {
	node := gpuNode(b, "n", api.ModeMIG, "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB")
	e := newEnv(b, nil, []*v1.Node{node})
	inv, err := api.DecodeInventory(node.Annotations[api.NodeInventoryAnnotation])
	if err != nil {
		b.Fatal(err)
	}
	var bound []*v1.Pod
	for i := range 24 {
		p := gpuPod(fmt.Sprintf("held-%d", i), api.ModeMIG, [2]int{1, 4000})
		p.Spec.NodeName = node.Name
		raw, err := api.EncodeMigReservations([]api.MigReservation{{GPUUUID: inv[i%8].ID, Profile: "1g.5gb", Placement: api.Placement{Start: i / 8, Size: 1}}})
		if err != nil {
			b.Fatal(err)
		}
		p.Annotations[api.MigReservationsAnnotation] = raw
		bound = append(bound, p)
	}
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	pod := gpuPod("p", api.ModeMIG, [2]int{1, 4000})
	pod.UID = "uid-p"
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		// A new generation: the node as the previous pod's binding left it.
		e.snapshot.set(cache.NewSnapshot(bound, []*v1.Node{node}))
		infos, _ := e.snapshot.NodeInfos().List()
		b.StartTimer()
		state := framework.NewCycleState()
		if _, st, _ := e.fw.RunPreFilterPlugins(e.ctx, state, pod); !st.IsSuccess() {
			b.Fatal(st)
		}
		if _, st := e.pl.SignPod(e.ctx, pod); !st.IsSuccess() {
			b.Fatal(st)
		}
		if st := e.pl.Filter(e.ctx, state, pod, infos[0]); !st.IsSuccess() {
			b.Fatal(st)
		}
		if st := e.pl.Reserve(e.ctx, state, pod, node.Name); !st.IsSuccess() {
			b.Fatal(st)
		}
		r, _ := e.pl.reservations.get(pod.UID)
		if _, _, err := bindingAnnotations(pod, node.Name, r.result, key); err != nil {
			b.Fatal(err)
		}
		e.pl.Unreserve(e.ctx, state, pod, node.Name)
	}
}
