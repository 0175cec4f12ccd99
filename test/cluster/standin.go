package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dynamig/dynamig/api"
)

// StandInWrite says what the stand-in writes, for reports: the device plugin's one write
// per GPU pod once its containers' devices exist.
const StandInWrite = "one pod patch per GPU pod (merge patch with the resourceVersion it read): " +
	"hami.io/bind-phase success and, on a MIG pod, every reservation's runtime identity " +
	"(made-up MIG UUID and GI/CI ids: no instance is created)"

// RealiseAsDevicePlugin does what the device plugin does once a bound GPU pod's devices
// exist, without creating any: one patch of the pod that completes each MIG reservation with
// a runtime identity (a made-up MIG UUID and GI/CI ids) and sets hami.io/bind-phase
// success. Like the device plugin it patches with the resourceVersion it read as a
// precondition and, on a conflict, reads the pod again and recomputes. It returns the
// writes it made (1, or 0 when the pod is gone, was replaced or the run is ending).
func RealiseAsDevicePlugin(ctx context.Context, client kubernetes.Interface, p *v1.Pod) int {
	pods := client.CoreV1().Pods(p.Namespace)
	uid := p.UID
	for attempt := 0; attempt < 5; attempt++ {
		annotations := map[string]string{api.BindPhaseAnnotation: api.BindPhaseSuccess}
		if raw, ok := p.Annotations[api.MigReservationsAnnotation]; ok {
			recs, err := api.DecodeMigReservations(raw)
			if err != nil {
				return 0 // the device plugin would fail the pod; the stand-in leaves it
			}
			for i := range recs {
				r := &recs[i]
				if !r.Realized() {
					r.SetRuntime(standInMigUUID(p.UID, r), uint32(r.Placement.Start), 0)
				}
			}
			if annotations[api.MigReservationsAnnotation], err = api.EncodeMigReservations(recs); err != nil {
				return 0
			}
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": p.ResourceVersion, "annotations": annotations}})
		_, err := pods.Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			return 1
		}
		if !apierrors.IsConflict(err) {
			return 0 // the pod is gone, or the run is ending
		}
		if p, err = pods.Get(ctx, p.Name, metav1.GetOptions{}); err != nil || p.UID != uid {
			return 0
		}
		if p.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating {
			return 0 // realised or failed by someone else meanwhile
		}
	}
	return 0
}

// standInMigUUID is a made-up MIG UUID for the reservation r of pod uid: unique per pod,
// container and device, and with the "MIG-" prefix a runtime identity must have.
func standInMigUUID(uid types.UID, r *api.MigReservation) string {
	return fmt.Sprintf("MIG-standin-%s-%d-%d", uid, r.ContainerIndex, r.DeviceIndex)
}

// StandIn plays the device plugin for one namespace's pods: each pod seen bound with
// bind-phase allocating is realised once, by RealiseAsDevicePlugin (StandInWrite), in its
// own goroutine, at most workers at a time (a device plugin runs per node, so pods of
// different nodes are realised concurrently). It writes with the client it was started
// with (cluster.UserDevicePlugin's, so the audit log attributes the writes to it) and
// counts them.
type StandIn struct {
	client kubernetes.Interface
	ns     string
	sem    chan struct{}
	writes atomic.Int64
	// paused makes it ignore pods, as a device plugin that has not been called yet.
	paused atomic.Bool

	mu   sync.Mutex
	done map[types.UID]bool
	wg   sync.WaitGroup
}

// StartStandIn starts a stand-in; stop ends it and waits for the realisations under way.
func StartStandIn(ctx context.Context, client kubernetes.Interface, ns string, workers int) (s *StandIn, stop func()) {
	s = &StandIn{client: client, ns: ns, sem: make(chan struct{}, workers), done: map[types.UID]bool{}}
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

// Writes is the number of writes the stand-in made: one per GPU pod it realised.
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
		s.writes.Add(int64(RealiseAsDevicePlugin(ctx, s.client, p)))
	}()
}
