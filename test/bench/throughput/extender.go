package throughput

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/request"
)

// extender is DynamicMIG's allocator behind kube-scheduler's HTTP extender interface, the
// way HAMi v2.10 deploys its scheduler: kube-scheduler (default plugins) calls filter with
// the candidate node names and bind for the chosen node, over HTTP with JSON. filter fits
// the pod on every candidate (placement.Fit over the node's inventory and the reservations
// of its pods and of the pods it placed but has not seen bound), keeps the best node by the
// plugin's GPU score and remembers the fit; bind creates the Binding with the reservation,
// the one write the plugin's Bind makes. Its writes are made as the scheduler's user, so
// they count as the scheduler's. It is a benchmark baseline, not a product: it has no
// preemption, no heartbeat check, no events, and does not sign the reservation.
type extender struct {
	client   kubernetes.Interface
	nodes    corelisters.NodeLister
	pods     cache.Indexer
	names    config.ResourceNames
	listener net.Listener
	server   *http.Server

	mu      sync.Mutex
	pending map[types.UID]pendingFit
	decoded map[string][]api.GPU // inventory annotation → GPUs
}

type pendingFit struct {
	node   string
	result *placement.Result
}

const podsByNode = "spec.nodeName"

// startExtender serves the extender on a free loopback port until ctx ends.
func startExtender(ctx context.Context, client kubernetes.Interface) (*extender, error) {
	factory := informers.NewSharedInformerFactory(client, 0)
	podInformer := factory.Core().V1().Pods().Informer()
	if err := podInformer.AddIndexers(cache.Indexers{podsByNode: func(obj any) ([]string, error) {
		if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	e := &extender{client: client, nodes: factory.Core().V1().Nodes().Lister(), pods: podInformer.GetIndexer(),
		pending: map[types.UID]pendingFit{}, decoded: map[string][]api.GPU{}}
	defaults := &config.DynamicMIGArgs{}
	defaults.SetDefaults()
	e.names = defaults.ResourceNames
	// A pod seen bound (or deleted) no longer needs its pending fit: its annotation speaks.
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName != "" {
				e.forget(p.UID)
			}
		},
		DeleteFunc: func(obj any) {
			if p, ok := obj.(*v1.Pod); ok {
				e.forget(p.UID)
			}
		},
	}); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/filter", e.handleFilter)
	mux.HandleFunc("/bind", e.handleBind)
	e.listener, e.server = l, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.server.Serve(l) }()
	go func() {
		<-ctx.Done()
		_ = e.server.Close()
	}()
	return e, nil
}

// URL is the extender's urlPrefix.
func (e *extender) URL() string { return "http://" + e.listener.Addr().String() }

func (e *extender) forget(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.pending, uid)
}

func (e *extender) handleFilter(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderArgs
	var res extenderv1.ExtenderFilterResult
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil || args.Pod == nil || args.NodeNames == nil {
		res.Error = fmt.Sprintf("bad filter arguments (%v)", err)
	} else {
		res = e.filter(args.Pod, *args.NodeNames)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&res)
}

func (e *extender) filter(pod *v1.Pod, nodeNames []string) extenderv1.ExtenderFilterResult {
	res := extenderv1.ExtenderFilterResult{FailedNodes: extenderv1.FailedNodesMap{}}
	req, err := request.Parse(pod, e.names, api.PolicyBinpack)
	if err != nil || req == nil {
		res.Error = fmt.Sprintf("not a GPU request: %v", err)
		return res
	}
	opts := placement.Options{MIGPolicy: api.PolicyBinpack, HAMiCorePolicy: api.PolicySpread, FragmentationAware: true}
	best, bestScore := "", int64(math.MinInt64)
	var bestResult *placement.Result
	for _, name := range nodeNames {
		gpus, err := e.nodeGPUs(name)
		if err != nil {
			res.FailedNodes[name] = err.Error()
			continue
		}
		fit, refusal := placement.Fit(gpus, &req.Request, opts)
		if refusal != nil {
			res.FailedNodes[name] = string(refusal.Reason)
			continue
		}
		score := int64(math.Round(1000*placement.NodeUtilisation(gpus, fit))) - int64(10*fit.Cost)
		if score > bestScore {
			best, bestScore, bestResult = name, score, fit
		}
	}
	if best == "" {
		return res
	}
	e.mu.Lock()
	e.pending[pod.UID] = pendingFit{node: best, result: bestResult}
	e.mu.Unlock()
	res.NodeNames = &[]string{best}
	return res
}

// nodeGPUs is the node's inventory with the reservations of its bound pods and of the
// pods this extender placed there and has not seen bound.
func (e *extender) nodeGPUs(name string) ([]placement.GPU, error) {
	node, err := e.nodes.Get(name)
	if err != nil {
		return nil, err
	}
	raw := node.Annotations[api.NodeInventoryAnnotation]
	e.mu.Lock()
	inv, ok := e.decoded[raw]
	e.mu.Unlock()
	if !ok {
		if inv, err = api.DecodeInventory(raw); err != nil {
			return nil, err
		}
		e.mu.Lock()
		e.decoded[raw] = inv
		e.mu.Unlock()
	}
	gpus := placement.GPUsOf(inv)
	objs, err := e.pods.ByIndex(podsByNode, name)
	if err != nil {
		return nil, err
	}
	for _, obj := range objs {
		p := obj.(*v1.Pod)
		raw, ok := p.Annotations[api.MigReservationsAnnotation]
		if !ok || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		recs, err := api.DecodeMigReservations(raw)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		placement.AddMIGReservations(gpus, recs)
	}
	e.mu.Lock()
	for _, f := range e.pending {
		if f.node == name {
			placement.AddAssignments(gpus, f.result.Assignments)
		}
	}
	e.mu.Unlock()
	return gpus, nil
}

func (e *extender) handleBind(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderBindingArgs
	var res extenderv1.ExtenderBindingResult
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
		res.Error = fmt.Sprintf("bad bind arguments: %v", err)
	} else if err := e.bind(r.Context(), args); err != nil {
		res.Error = err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&res)
}

// bind creates the Binding with the reservation: the plugin's one write.
func (e *extender) bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) error {
	e.mu.Lock()
	f, ok := e.pending[args.PodUID]
	e.mu.Unlock()
	if !ok || f.node != args.Node {
		return fmt.Errorf("no fit for pod %s/%s on %s", args.PodNamespace, args.PodName, args.Node)
	}
	binding, err := reservationBinding(args.PodNamespace, args.PodName, args.PodUID, args.Node, f.result.MigReservations())
	if err != nil {
		return err
	}
	return e.client.CoreV1().Pods(args.PodNamespace).Bind(ctx, binding, metav1.CreateOptions{})
}

// reservationBinding is the Binding of a pod to node that carries its MIG reservations the way
// DynamicMIG's Bind writes them (the reservations, the node, the bind time and phase), without
// the signature.
func reservationBinding(namespace, name string, uid types.UID, node string, res []api.MigReservation) (*v1.Binding, error) {
	raw, err := api.EncodeMigReservations(res)
	if err != nil {
		return nil, err
	}
	return &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uid, Annotations: map[string]string{
			api.MigReservationsAnnotation: raw,
			api.AssignedNodeAnnotation:    node,
			api.BindTimeAnnotation:        strconv.FormatInt(time.Now().Unix(), 10),
			api.BindPhaseAnnotation:       api.BindPhaseAllocating,
		}},
		Target: v1.ObjectReference{Kind: "Node", Name: node},
	}, nil
}
