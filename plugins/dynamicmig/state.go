package dynamicmig

import (
	"fmt"
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
	// refused holds the nodes whose refusal of this pod was counted in this cycle, shared
	// with the cycle's clones: kube-scheduler's batching filters the previous pod's node as a
	// probe before the pod's own Filter calls, and preemption's dry runs filter again.
	refused *sync.Map
}

// observeRefusal counts node's refusal of the pod, once per cycle.
func (s *stateData) observeRefusal(node, reason string) {
	if _, seen := s.refused.LoadOrStore(node, struct{}{}); !seen {
		observeRefusal(reason)
	}
}

// maxPresizedFits bounds the room PreFilter makes for a cycle's fits: kube-scheduler filters
// a share of a large cluster's nodes per pod (percentageOfNodesToScore), not all of them.
const maxPresizedFits = 1024

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
	c := &stateData{req: s.req, key: s.key, attempt: s.attempt, now: s.now, devices: s.devices, quota: s.quota, fits: make(map[string]*nodeFit, len(s.fits)), refused: s.refused}
	for k, v := range s.fits {
		c.fits[k] = v
	}
	return c
}

func (s *stateData) setFit(node string, f *nodeFit) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
