package cluster

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
)

// RealiseAsDevicePlugin does what the device plugin does once a bound GPU pod's devices
// exist, without creating any: it sets hami.io/bind-phase success and releases the node's
// hand-off Lease if the pod still holds it. It returns the writes it made; a pod that is
// gone or a Lease already taken over is not an error.
func RealiseAsDevicePlugin(ctx context.Context, client kubernetes.Interface, p *v1.Pod) int {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.BindPhaseAnnotation: api.BindPhaseSuccess}}})
	if _, err := client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return 0 // the pod is gone, or the run is ending
	}
	return 1 + ReleaseHandoff(ctx, client, p)
}

// ReleaseHandoff clears the holder of the pod's node hand-off Lease if the pod holds it, as
// the device plugin does after the pod's last container: the one write the throughput
// benchmark's stand-in makes per GPU pod. It returns the writes it made.
func ReleaseHandoff(ctx context.Context, client kubernetes.Interface, p *v1.Pod) int {
	writes := 0
	holder := api.HandoffHolder(p.Namespace, p.Name, string(p.UID))
	leases := client.CoordinationV1().Leases(api.DefaultSystemNamespace)
	_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, api.HandoffLeaseName(p.Spec.NodeName), metav1.GetOptions{})
		if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != holder {
			return nil // taken over already: nothing to release
		}
		l.Spec.HolderIdentity = nil
		if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			return err
		}
		writes++
		return nil
	})
	return writes
}

// StandIn plays the device plugin for one namespace's pods: each pod seen bound with
// bind-phase allocating is realised once, by Realise (RealiseAsDevicePlugin or
// ReleaseHandoff), in its own goroutine, at most Workers at a time (a device plugin runs per
// node, so pods of different nodes are realised concurrently). It writes with the client
// it was started with (cluster.UserDevicePlugin's, so the audit log attributes the writes
// to it) and counts them.
type StandIn struct {
	client  kubernetes.Interface
	ns      string
	realise func(context.Context, kubernetes.Interface, *v1.Pod) int
	sem     chan struct{}
	writes  atomic.Int64
	// paused makes it ignore pods, as a device plugin that has not been called yet.
	paused atomic.Bool

	mu   sync.Mutex
	done map[types.UID]bool
	wg   sync.WaitGroup
}

// StartStandIn starts a stand-in; stop ends it and waits for the realisations under way.
func StartStandIn(ctx context.Context, client kubernetes.Interface, ns string, workers int,
	realise func(context.Context, kubernetes.Interface, *v1.Pod) int) (s *StandIn, stop func()) {
	s = &StandIn{client: client, ns: ns, realise: realise, sem: make(chan struct{}, workers), done: map[types.UID]bool{}}
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	_, _ = factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.handle(ctx, obj) },
		UpdateFunc: func(_, obj any) { s.handle(ctx, obj) },
	})
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return s, func() {
		cancel()
		factory.Shutdown()
		s.wg.Wait()
	}
}

// Writes is the number of writes the stand-in made.
func (s *StandIn) Writes() int64 { return s.writes.Load() }

// Pause makes the stand-in ignore pods until Resume.
func (s *StandIn) Pause() { s.paused.Store(true) }

// Resume ends a pause and realises the pods it ignored meanwhile.
func (s *StandIn) Resume(ctx context.Context) error {
	s.paused.Store(false)
	list, err := s.client.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range list.Items {
		s.handle(ctx, &list.Items[i])
	}
	return nil
}

func (s *StandIn) handle(ctx context.Context, obj any) {
	p, ok := obj.(*v1.Pod)
	if !ok || p.Spec.NodeName == "" || p.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating || s.paused.Load() {
		return
	}
	s.mu.Lock()
	if s.done[p.UID] {
		s.mu.Unlock()
		return
	}
	s.done[p.UID] = true
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-s.sem }()
		s.writes.Add(int64(s.realise(ctx, s.client, p)))
	}()
}
