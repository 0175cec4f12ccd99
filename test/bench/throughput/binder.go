package throughput

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dynamig/dynamig/api"
)

// binder stands in for every scheduler in the floor scenarios (h) and (i): it receives the
// scenario's pods as kube-scheduler does (a pod informer over protobuf, terminal pods left
// out by the same field selector) and binds each unbound pod to the next node in turn,
// deciding nothing: no filter, no score, no event. A GPU pod's Binding carries what
// DynamicMIG's carries: a 1g.5gb reservation on one of the node's GPUs, the node, the bind
// time and phase, and a signature of the same length (computed once, not per pod). Its
// writes are made as the scheduler's user. So what the process spends per pod in (h) or (i)
// is what any scheduler of those pods makes it spend at least — the create, the watch
// events, the Binding and etcd — and (i)'s pods/s bounds the rate any scheduler of these GPU
// pods can reach here: (i)/(a) < 1 means no scheduler's GPU pods can bind as fast as (a)'s
// CPU pods in this process, however little it spends deciding.
type binder struct {
	client kubernetes.Interface
	tmpl   *nodeTemplate
	nodes  int
	gpu    bool
	// signature is a reservation signature's value, of the length DynamicMIG writes.
	signature string
	next      atomic.Int64
	queue     chan *v1.Pod
}

// binderWorkers bind concurrently, as kube-scheduler's binding cycles run in goroutines.
const binderWorkers = 16

// startBinder binds the pods of namespace ns until ctx ends; nodes are nodeName(0..nodes-1).
func startBinder(ctx context.Context, client kubernetes.Interface, tmpl *nodeTemplate, ns string, nodes int, gpu bool) error {
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	signature := api.Signature(key, "00000000-0000-0000-0000-000000000000", nodeName(0), api.MigReservationsAnnotation, "[]")
	b := &binder{client: client, tmpl: tmpl, nodes: nodes, gpu: gpu, signature: signature, queue: make(chan *v1.Pod, 1024)}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "status.phase!=Succeeded,status.phase!=Failed" }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName == "" {
			select {
			case b.queue <- p:
			case <-ctx.Done():
			}
		}
	}}); err != nil {
		return err
	}
	var workers sync.WaitGroup
	for range binderWorkers {
		workers.Go(func() {
			for {
				select {
				case p := <-b.queue:
					// A failed Binding leaves its pod unbound: the scenario says so
					// (Result.Incomplete); nothing retries it.
					_ = b.bind(ctx, p)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("the binder's pod informer did not sync")
	}
	go func() {
		<-ctx.Done()
		factory.Shutdown()
		workers.Wait()
	}()
	return nil
}

// bind binds p to the next node in turn.
func (b *binder) bind(ctx context.Context, p *v1.Pod) error {
	i := int(b.next.Add(1) - 1)
	node := nodeName(i % b.nodes)
	if !b.gpu {
		return b.client.CoreV1().Pods(p.Namespace).Bind(ctx, &v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID},
			Target:     v1.ObjectReference{Kind: "Node", Name: node},
		}, metav1.CreateOptions{})
	}
	gpu := (i / b.nodes) % len(b.tmpl.uuids)
	binding, err := reservationBinding(p.Namespace, p.Name, p.UID, node, []api.MigReservation{{GPUUUID: b.tmpl.uuidFor(i%b.nodes, gpu), Profile: "1g.5gb",
		Placement: api.Placement{Start: (i / b.nodes / len(b.tmpl.uuids)) % 7, Size: 1}}})
	if err != nil {
		return err
	}
	binding.Annotations[api.ReservationSignatureAnnotation] = b.signature
	return b.client.CoreV1().Pods(p.Namespace).Bind(ctx, binding, metav1.CreateOptions{})
}
