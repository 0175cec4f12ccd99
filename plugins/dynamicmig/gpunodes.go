package dynamicmig

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// gpuNodes is, per mode, the names of the nodes that publish an inventory with a GPU of that
// mode ("": of either), which PreFilter returns as its PreFilterResult: a GPU pod is filtered
// on those nodes only, and the others, which no preemption can make fit, are not preemption
// candidates either. A node whose inventory does not decode is in every set, so that Filter
// says why it is refused. The sets are computed once per list of Node objects: PreFilter
// compares the snapshot's Nodes with those they were computed from (a pointer each) and
// recomputes only when one was added, removed or updated. kube-scheduler clones the set it
// is given (PreFilterResult.Merge), so one set serves many cycles.
type gpuNodes struct {
	mu     sync.Mutex
	from   []*v1.Node
	byMode map[string]sets.Set[string]
}

// names is the set of nodes with a GPU of mode, as of nodes.
func (g *gpuNodes) names(inv *inventoryCache, nodes []fwk.NodeInfo, mode string) sets.Set[string] {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.current(nodes) {
		g.compute(inv, nodes)
	}
	return g.byMode[mode]
}

func (g *gpuNodes) current(nodes []fwk.NodeInfo) bool {
	if g.byMode == nil || len(nodes) != len(g.from) {
		return false
	}
	for i, ni := range nodes {
		if ni.Node() != g.from[i] {
			return false
		}
	}
	return true
}

func (g *gpuNodes) compute(inv *inventoryCache, nodes []fwk.NodeInfo) {
	g.from = make([]*v1.Node, len(nodes))
	g.byMode = map[string]sets.Set[string]{"": {}, api.ModeMIG: {}, api.ModeHAMiCore: {}}
	for i, ni := range nodes {
		n := ni.Node()
		g.from[i] = n
		gpus, ok, err := inv.get(n)
		switch {
		case !ok:
		case err != nil:
			for _, s := range g.byMode {
				s.Insert(n.Name)
			}
		default:
			for mode, s := range g.byMode {
				if placement.HasGPUOfMode(gpus, mode) {
					s.Insert(n.Name)
				}
			}
		}
	}
}
