package dynamicmig

import (
	"fmt"
	"maps"
	"sync"
	"time"

	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/quota"
	"github.com/dynamig/dynamig/plugins/dynamicmig/request"
)

// stateData is what PreFilter computes once per cycle, and what Filter found per node.
type stateData struct {
	req *request.Request
	// key identifies the request's shape for the fit cache.
	key string
	// attempt collects the nodes' outcomes for the pending-pods gauge.
	attempt *attempt
	// now is when the cycle started; Filter judges heartbeats by it.
	now time.Time
	// devices is the device count taken from NodeResourcesFit's request, which Filter
	// checks in its place (takeFitRequest); 0 when none was taken.
	devices int64
	// quota is the pod's namespace's GPU quotas and use, nil when none limits it.
	quota *quota.Check

	mu   sync.Mutex
	fits map[string]*nodeFit
	// fitsRoom is the room fits gets once the cycle filters more than a few nodes (setFit).
	fitsRoom int
	// refused holds the nodes whose refusal of this pod was counted in this cycle, shared
	// with the cycle's clones: kube-scheduler's batching filters the previous pod's node as a
	// probe before the pod's own Filter calls, and preemption's dry runs filter again.
	refused *sync.Map
	// nominatedFits holds, per node, the fit found with the pods nominated there, shared with
	// the cycle's clones: kube-scheduler filters a node with pods nominated on it twice, first
	// with them (on a clone of the state), then without (on this state), and the fit kept
	// must be the first, which leaves their room free (nominatedFit).
	nominatedFits *sync.Map
}

// observeRefusal counts node's refusal of the pod, once per cycle.
func (s *stateData) observeRefusal(node, reason string) {
	if _, seen := s.refused.LoadOrStore(node, struct{}{}); !seen {
		observeRefusal(reason)
	}
}

// A cycle's fits start small: a batched pod is filtered on one or two nodes (the hinted one,
// and the previous pod's as a probe). Past fewFits, fits moves to a map with room for the
// nodes kube-scheduler may filter: growing it node by node costs more
// (BenchmarkCycle1000Nodes), and so does making that room for every pod in a burst
// (docs/benchmarks/throughput.md). maxPresizedFits bounds the room: kube-scheduler filters a
// share of a large cluster's nodes per pod (percentageOfNodesToScore), not all of them.
const (
	fewFits         = 8
	maxPresizedFits = 1024
)

// nominatedFit is the fit to keep for node: f, computed on a NodeInfo with the pods nominated
// there when withNominated (remembered for the pass without them), else the fit the pass
// with them found, if there was one: it fits without them too (they only add occupancy),
// and a fit chosen without them could take the room their preemption or relocation freed.
func (s *stateData) nominatedFit(node string, f *nodeFit, withNominated bool) *nodeFit {
	if withNominated {
		s.nominatedFits.Store(node, f)
		return f
	}
	if v, ok := s.nominatedFits.Load(node); ok {
		return v.(*nodeFit)
	}
	return f
}

// nodeFit is a pod's fit on one node and the occupancy it was computed against.
// It may be shared by cycles (fitCache): nothing writes to it after Filter.
type nodeFit struct {
	result *placement.Result
	gpus   []placement.GPU
	// gpuUtil is the node's GPU utilisation after placement; inUse whether a GPU of it was
	// in use before.
	gpuUtil float64
	inUse   bool
}

// Clone implements fwk.StateData; preemption's dry runs work on clones.
func (s *stateData) Clone() fwk.StateData {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &stateData{req: s.req, key: s.key, attempt: s.attempt, now: s.now, devices: s.devices, quota: s.quota,
		fits: maps.Clone(s.fits), fitsRoom: s.fitsRoom, refused: s.refused, nominatedFits: s.nominatedFits}
}

func (s *stateData) setFit(node string, f *nodeFit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.fits == nil:
		s.fits = make(map[string]*nodeFit, fewFits)
	case len(s.fits) == fewFits && s.fitsRoom > fewFits:
		grown := make(map[string]*nodeFit, s.fitsRoom)
		maps.Copy(grown, s.fits)
		s.fits = grown
	}
	s.fits[node] = f
}

func (s *stateData) fit(node string) (*nodeFit, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.fits[node]
	return f, ok
}

func readState(state fwk.CycleState) (*stateData, error) {
	c, err := state.Read(stateKey)
	if err != nil {
		return nil, fmt.Errorf("reading %q from the cycle state: %w", stateKey, err)
	}
	s, ok := c.(*stateData)
	if !ok {
		return nil, fmt.Errorf("%+v is not a %s state", c, Name)
	}
	return s, nil
}
