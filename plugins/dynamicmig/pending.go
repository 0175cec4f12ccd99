package dynamicmig

import (
	"maps"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// The outcomes of a GPU pod's scheduling attempt on a node, from the least to the most
// hopeful; a pending pod counts under the closest any node came. A refusal before the
// allocator ran says nothing of how close the request came; the allocator's reasons do, in
// their own order; a fit on some node means that another plugin, or the binding, kept the pod.
const (
	// rankNone: no node's outcome yet, or other plugins refused every node before DynamicMIG.
	rankNone int32 = iota
	rankInvalidRequest
	rankNoInventory
	rankUnreadableInventory
	rankUnreadableReservation
	rankHeartbeat
	// rankAllocator is the least hopeful of placement.Reasons; rankQuota (a fit its
	// namespace's GPU quota refused) follows the last, and rankFit follows it.
	rankAllocator
)

// Reasons of the pending-pods gauge that no refusal message carries.
const (
	reasonNotRefused            = "not refused by DynamicMIG"
	reasonBinding               = "binding"
	reasonUnreadableInventory   = "node's GPU inventory unreadable"
	reasonUnreadableReservation = "unreadable GPU reservation on the node"
)

var (
	rankQuota = rankAllocator + int32(len(placement.Reasons))
	rankFit   = rankQuota + 1
	// pendingReasons is the gauge's reason of each rank.
	pendingReasons = func() []string {
		r := []string{reasonNotRefused, reasonInvalidRequest, reasonNoInventory, reasonUnreadableInventory, reasonUnreadableReservation, reasonHeartbeat}
		for _, a := range placement.Reasons {
			r = append(r, string(a))
		}
		return append(r, reasonQuota, reasonNotRefused)
	}()
	allocatorRanks = func() map[placement.Reason]int32 {
		m := make(map[placement.Reason]int32, len(placement.Reasons))
		for i, r := range placement.Reasons {
			m[r] = rankAllocator + int32(i)
		}
		return m
	}()
)

// attempt is a GPU pod's latest scheduling attempt, shared by its cycle state, the state's
// clones (preemption's dry runs, nominated pods) and pendingPods.
type attempt struct {
	namespace, name string
	// rank is the most hopeful outcome on any node so far. Filter runs in parallel across
	// nodes and only ever raises it.
	rank atomic.Int32
	// reserved is set from Reserve until Unreserve: the pod is being bound.
	reserved atomic.Bool
}

// note records one node's outcome.
func (a *attempt) note(rank int32) {
	for {
		old := a.rank.Load()
		if rank <= old || a.rank.CompareAndSwap(old, rank) {
			return
		}
	}
}

func (a *attempt) reason() string {
	if a.reserved.Load() {
		return reasonBinding
	}
	return pendingReasons[a.rank.Load()]
}

// pendingPods holds the latest attempt of every GPU pod this scheduler tried and has not
// bound, for the dynamig_scheduler_pending_pods gauge.
type pendingPods struct {
	mu       sync.Mutex
	attempts map[types.UID]*attempt
}

func newPendingPods() *pendingPods { return &pendingPods{attempts: map[types.UID]*attempt{}} }

// start begins the pod's attempt, replacing its last.
func (p *pendingPods) start(pod *v1.Pod) *attempt {
	a := &attempt{namespace: pod.Namespace, name: pod.Name}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts[pod.UID] = a
	return a
}

// remove forgets a pod that is bound or deleted.
func (p *pendingPods) remove(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.attempts, uid)
}

// count is the number of pods per reason, every reason present, among the pods that the
// lister shows unbound. A pod whose Binding went through although Bind got an error shows
// bound and is not counted; its attempt goes when the pod is deleted.
func (p *pendingPods) count(pods corelisters.PodLister) map[string]int {
	p.mu.Lock()
	attempts := maps.Clone(p.attempts)
	p.mu.Unlock()
	counts := make(map[string]int, len(pendingReasons)+1)
	for _, r := range pendingReasons {
		counts[r] = 0
	}
	counts[reasonBinding] = 0
	for uid, a := range attempts {
		if pod, err := pods.Pods(a.namespace).Get(a.name); err == nil && pod.UID == uid && pod.Spec.NodeName == "" {
			counts[a.reason()]++
		}
	}
	return counts
}
