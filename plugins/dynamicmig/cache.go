package dynamicmig

import (
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// inventoryCache decodes each node's inventory annotation once per distinct value.
type inventoryCache struct {
	mu    sync.Mutex
	nodes map[string]decodedInventory
	// largest is the most memory of one device, per mode ("" for either), over every
	// inventory decoded so far. It never shrinks: it can only let PreFilter pass a request
	// that Filter then refuses, never refuse one that fits.
	largest map[string]int
}

type decodedInventory struct {
	raw  string
	gpus []api.GPU
	err  error
}

func newInventoryCache() *inventoryCache {
	return &inventoryCache{nodes: map[string]decodedInventory{}, largest: map[string]int{}}
}

// get returns the node's GPUs; ok is false when the node publishes no inventory.
func (c *inventoryCache) get(node *v1.Node) (gpus []api.GPU, ok bool, err error) {
	raw, ok := node.Annotations[api.NodeInventoryAnnotation]
	if !ok {
		return nil, false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, hit := c.nodes[node.Name]; hit && d.raw == raw {
		return d.gpus, true, d.err
	}
	gpus, err = api.DecodeInventory(raw)
	c.nodes[node.Name] = decodedInventory{raw: raw, gpus: gpus, err: err}
	for i := range gpus {
		m := gpus[i].LargestDeviceMiB()
		c.largest[gpus[i].Mode] = max(c.largest[gpus[i].Mode], m)
		c.largest[""] = max(c.largest[""], m)
	}
	return gpus, true, err
}

// onNode decodes a Node's inventory as the informer delivers it (added, or updated with a
// new annotation value), so that PreFilter and Filter find it decoded; a node that no longer
// publishes one is forgotten.
func (c *inventoryCache) onNode(obj any) {
	n, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	if _, has := n.Annotations[api.NodeInventoryAnnotation]; !has {
		c.forget(n.Name)
		return
	}
	_, _, _ = c.get(n)
}

// onNodeDelete forgets a deleted node's inventory.
func (c *inventoryCache) onNodeDelete(obj any) {
	if n, ok := deletedObject(obj).(*v1.Node); ok {
		c.forget(n.Name)
	}
}

func (c *inventoryCache) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nodes, name)
}

// decoded reports whether the node's inventory is decoded, for tests.
func (c *inventoryCache) decoded(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.nodes[name]
	return ok
}

// largestSeen is the most memory of one device of the mode ("" for either) seen so far.
func (c *inventoryCache) largestSeen(mode string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.largest[mode]
}

// reservationCache holds the reservations Reserve made for pods whose Binding (and so
// whose annotation) the scheduler has not seen yet; NodeInfo shows those pods without it.
// It also memoises decoded annotations, which Filter reads for every pod on every node.
type reservationCache struct {
	mu       sync.RWMutex
	inflight map[types.UID]inflight
	decoded  map[string][]api.MigReservation
}

type inflight struct {
	// pod is the reserved pod's namespace and name, node where it is reserved.
	pod    types.NamespacedName
	node   string
	result *placement.Result
}

// maxDecoded bounds the memo of decoded annotations; it is dropped whole when full.
const maxDecoded = 1 << 16

func newReservationCache() *reservationCache {
	return &reservationCache{inflight: map[types.UID]inflight{}, decoded: map[string][]api.MigReservation{}}
}

func (c *reservationCache) add(pod *v1.Pod, node string, res *placement.Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight[pod.UID] = inflight{pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, node: node, result: res}
}

func (c *reservationCache) get(uid types.UID) (inflight, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.inflight[uid]
	return r, ok
}

func (c *reservationCache) remove(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.inflight, uid)
}

func (c *reservationCache) inflightCount() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.inflight)
}

// unbound counts the reservations whose pods the lister does not show bound with one: a
// bound pod's entry stays until a NodeInfo shows its annotation (addOccupancy), which may be
// long after the Binding, on a node nothing is scheduled to.
func (c *reservationCache) unbound(pods corelisters.PodLister) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for uid, r := range c.inflight {
		p, err := pods.Pods(r.pod.Namespace).Get(r.pod.Name)
		if err != nil || p.UID != uid || p.Spec.NodeName == "" || !hasReservation(p) {
			n++
		}
	}
	return n
}

// decode returns a pod annotation's reservations, decoding each distinct value once.
func (c *reservationCache) decode(raw string) ([]api.MigReservation, error) {
	c.mu.RLock()
	recs, ok := c.decoded[raw]
	c.mu.RUnlock()
	if ok {
		return recs, nil
	}
	recs, err := api.DecodeMigReservations(raw)
	if err != nil {
		return nil, err
	}
	c.remember(raw, recs)
	return recs, nil
}

// remember memoises raw's records (what DecodeMigReservations returns for it): Bind, which
// has just encoded them, saves Filter decoding the annotation of every pod it binds.
func (c *reservationCache) remember(raw string, recs []api.MigReservation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.decoded) >= maxDecoded {
		c.decoded = map[string][]api.MigReservation{}
	}
	c.decoded[raw] = recs
}

// fitCache remembers, per node, the last fit computed: the same request against the same
// NodeInfo generation (which changes with every pod added or removed and every node update,
// preemption's dry runs included, but not in a pod-group cycle, which bypasses the cache:
// podGroupCycle) gives the same fit. Replicas of one workload ask alike,
// so a scheduling cycle mostly recomputes only the node the previous pod went to.
// A sync.Map: Filter's parallel readers never contend; entries are written on misses only.
type fitCache struct {
	nodes sync.Map // node name → cachedFit
	size  atomic.Int64
}

type cachedFit struct {
	generation int64
	request    string
	fit        *nodeFit
	refusal    *placement.Refusal
	// withNominated: the NodeInfo held pods nominated there (stateData.nominatedFit).
	withNominated bool
}

// maxCachedNodes bounds the cache; it is dropped whole when full (deleted nodes).
const maxCachedNodes = 1 << 16

func newFitCache() *fitCache { return &fitCache{} }

func (c *fitCache) get(node string, generation int64, request string) (cachedFit, bool) {
	v, ok := c.nodes.Load(node)
	if !ok {
		return cachedFit{}, false
	}
	e := v.(cachedFit)
	if e.generation != generation || e.request != request {
		return cachedFit{}, false
	}
	return e, true
}

func (c *fitCache) put(node string, e cachedFit) {
	if c.size.Load() >= maxCachedNodes {
		c.nodes.Clear()
		c.size.Store(0)
	}
	if _, loaded := c.nodes.Swap(node, e); !loaded {
		c.size.Add(1)
	}
}
